"""Example pipelines; ``workspace.yaml`` loads ``pipelines.definitions``."""
