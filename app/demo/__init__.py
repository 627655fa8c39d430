"""Models made here: the seeing demo model and random-weight twins of real architectures."""
