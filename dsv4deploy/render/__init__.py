"""Profile -> the exact files the host runs (units, NCCL env, manifest), where they live, and the
read-back that proves they say what the profile asked. Pure."""
