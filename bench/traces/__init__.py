"""Recording trace-v1 files from real trainers on a GPU machine (see record_traces.py)."""
