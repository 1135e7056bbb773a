"""What every request's record measures: the process-start clock and stage timeline (coldstart),
GPU energy from NVML's counter (energy) and the idle power it is judged against (idle_power)."""
