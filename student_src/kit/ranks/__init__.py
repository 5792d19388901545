"""Ranks and process groups: start N local ranks and watch them (launch), form the group every
way a run can start (process_group), the world-size check, the network interface ranks talk over.

Rooms it may import: the contract, plots, core."""
