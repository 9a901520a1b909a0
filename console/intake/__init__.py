"""Agent messages into the database: the batcher (batcher.py) gathers what every link of this console process
hands over and applies it in two stages (stages.py): hosts (leases, closed links, acks), then readings (replicas'
states, GPU readings, reports' host fields)."""
