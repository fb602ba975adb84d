"""The job, written down once: its plan of processes (``plan.py``), which every launcher
(local, Slurm, Kubernetes) renders."""
