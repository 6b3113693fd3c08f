"""A DVC project's side: the pipeline definition, scaffolding, sample data, pruning."""
