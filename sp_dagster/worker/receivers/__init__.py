"""Receiver nodes: HTTP sources served on a worker's own address (in-process or as their own processes), publishing what they take in."""
