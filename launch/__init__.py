"""How a job's agents are started on its hosts: the command lines (`launch_plan`) and the
launchers that run them (`launchers`). Used on both sides: a job's rendezvous starts its hosts'
agents with them, and a host's pool agent starts the agents of the jobs placed on it."""
