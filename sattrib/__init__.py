"""sattrib: Slurm-native fault attribution for distributed GPU jobs."""
__version__ = "0.1.0"
