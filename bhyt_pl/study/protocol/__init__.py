"""What a study decides before and after its runs, with no Lightning, submitit or matplotlib: the shared types,
statistics, design, rules, claims and the confirmation's power plan."""
