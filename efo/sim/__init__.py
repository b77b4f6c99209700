"""The lease plane in simulated time: W workers' real code on one virtual clock (see ``python -m efo.sim``)."""
