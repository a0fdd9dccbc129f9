"""The online trainer: model, checkpoints, data balancing and the worker process."""
