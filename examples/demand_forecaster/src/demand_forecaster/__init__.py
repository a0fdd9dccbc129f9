"""A streaming demand regressor: the example of a trainer that is not kale-dagster's own."""
