"""Fine-tuning: tasks (GLUE, SQuAD, RACE, the user's own files), their heads,
official metrics, and the loop that trains them with the trainer's pieces."""
