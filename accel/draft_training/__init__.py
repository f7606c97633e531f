"""Drafts for speculative decoding, made from the target: EAGLE-style feature drafts (`eagle_train`), small
standalone drafts (`distill`), their prompts, the `accel draft train` command, and offline acceptance analysis.
Uses `accel.speculative` and `accel.runtime`; the runtime never imports this package.
"""


def distill_draft(target_path, out_dir, config, calibration_dir, progress: bool = True):
    """Train the draft a `DistillConfig` (the recipe's `speculation.distill`, `accel draft train`'s options)
    describes; returns the trainer's result (EagleTrainResult or DraftTrainResult)."""
    common = dict(time_budget_minutes=config.time_budget_minutes, calibration_dir=calibration_dir,
                  num_prompts=config.resolved("num_prompts"), max_new_tokens=config.max_new_tokens,
                  learning_rate=config.resolved("learning_rate"), draft_vocab_size=config.draft_vocab_size,
                  seed=config.seed, progress=progress)
    if config.kind == "eagle":
        from accel.draft_training.eagle_train import train_eagle

        return train_eagle(target_path, out_dir, model_written_fraction=config.model_written_fraction,
                           gen_fraction=config.gen_fraction, init_from=config.init_from, **common)
    from accel.draft_training.distill import train_draft

    return train_draft(target_path, out_dir, num_layers=config.num_layers, layer_choice=config.layer_choice,
                       train_head=config.train_head, **common)
