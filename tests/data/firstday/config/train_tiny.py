# a config file given as train.py's first argument (init ships it)
max_iters = 60
eval_interval = 20
