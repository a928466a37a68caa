"""Starting a worker, all in one room: the ordered ways (`ways.py`: warm spare, template fork,
cold spare, fresh process), the warm spares (`spare_pool.py`, the agent's side; `spare_process.py`,
the spare's own), the worker template (`template.py`, the agent's side; `template_process.py`,
the template's own), the worker's thread count (`threads.py`) and its heap's settings (`heap.py`)."""
