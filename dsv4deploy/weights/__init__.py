"""Model weights: what a checkpoint must hold file by file, the check that runs on the host, and
the operator's Hugging Face token."""
