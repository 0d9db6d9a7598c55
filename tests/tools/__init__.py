"""Developer and CI tools used by the tests (not part of the dsv4deploy package)."""
