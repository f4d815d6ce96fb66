"""What a person sees: Prefect artifacts and charts, readable numbers, run names, the terminal row."""
