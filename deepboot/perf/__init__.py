"""Performance models: goodput, fitting, batch-size optimizer, restart cost, catalog."""
