"""What a run's episode records say: metrics, their report, trajectories for fine-tuning."""
