"""Each recipe's real trainer through gpujob on a GPU (issue 23): the driver, its lanes, the trainers."""
