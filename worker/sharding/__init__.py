"""The machinery of a model sharded inside replica groups (FSDP2), under `hvd.elastic.ShardedState`
and `hvd.elastic.mesh()` (which users import from `ringmaster.torch.elastic`): which commit and
shards a ring of groups goes on from (`shard_plan`), a survivor's objects built again in its last
generation's memory (`kept_memory`) and without initializing what a commit overwrites
(`no_init`), FSDP2's collectives that give up at the generation's end (`guarded_comms`,
`fsdp_comms`), the mesh's connections cut when it ends (`mesh_sockets`), and durable checkpoints
in DCP's format (`sharded_checkpoint`)."""
