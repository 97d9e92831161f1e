"""What `lynx export` needs beyond the plan's split, one module per concern: layout.py (each layer's role and
Megatron's pipeline-layout flags), megatron_model.py (the Megatron-LM flags that build the profiled model) and
torchtitan_model.py (torchtitan's model module, flavor and parallel names). lynx_planner/export.py assembles them."""
