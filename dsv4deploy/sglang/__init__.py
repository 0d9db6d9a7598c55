"""What the project knows of SGLang: its versions and flags (as data), the patches it ships, the
launch check's parser, and how a server proves it is up."""
