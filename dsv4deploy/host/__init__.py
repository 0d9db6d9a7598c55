"""Everything that touches the GPU host: facts (what it says), the snapshot that reads them in
one command, the state a deploy decides from, the operations derived from it, and the small
direct effects (host/io.py). `tasks/` holds the `@deploy` steps that use them."""
