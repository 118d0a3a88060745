"""What the user writes: the job spec's model and its sections (types, throughput, checkpoint, notify,
defaults, layers, requirement files, secrets) and, under recipes/, one module per trainer's
conventions."""
