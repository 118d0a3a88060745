"""What gpujob does, values in and out and never typer: plan, ship, submit, follow, fleet, doctor, the
laptop's job index, and the bodies both faces (cli/, daemon/) run."""
