"""The control loop: observations in, decisions out, rescales applied."""
