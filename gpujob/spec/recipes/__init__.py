"""The trainers' conventions (``recipe:``): one module per trainer and the registry that names them."""
