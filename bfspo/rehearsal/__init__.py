"""The rehearsal of the paper's DAG on CPU (`make rehearsal`): `config` derives its config from
config/paper.yaml, `stand_in` builds a tiny random-init model per size class, and `sft` teaches it
the answer format on the training questions it then sees in RL, so that its groups mix right and
wrong answers."""
