"""What the control plane stores besides coordination: deployments, instances, assignments, state, events."""
