"""The single controller: owns the dataflow and the schedule, never the RL math."""
