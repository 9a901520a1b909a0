"""The inference gateway: one authenticated front door (OpenAI-compatible /v1, Open Inference Protocol /v2)
for every deployment in the fleet, with routing, limits, demand queues and the measurements the SLO loop
reads. See docs/inference.md."""
