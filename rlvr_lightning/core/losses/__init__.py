"""Policy and value losses: `PolicyLoss` objects that own their hyper-parameters and return an unaggregated
`[N, T]` loss, importable from `rlvr_lightning.core` (a recipe names one as `rlvr_lightning.core.PPOClip` under
`model.init_args.loss`, or by its shorthand)."""
