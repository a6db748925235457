"""Unity ML-Agents: the env adapter and the install helper for mlagents-envs on Python 3.11."""
