"""The shared benchmark runner: run variants of a job through deploy/launch.sh, collect
figures, write results/YYYYMMDD_HHMMSS/ (summary.json, detailed.log, profile.svg, plots)."""
