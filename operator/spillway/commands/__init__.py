"""`spillway plan` and `spillway render`: the core and the controller's rendering, offline, on the command line."""
