"""The INRI network simulator: thousands of shipped engines over a modelled network."""
