"""What a job asks Slurm for besides its size: the config's `slurm` keys, resolved for one job, as
the resources of snakemake-executor-plugin-slurm (config/README.md, "slurm").

- `partition`, `account`, `qos`, `reservation`, `extra` and `max_runtime` (the partition's time
  limit in minutes, which the plan holds every job to: bfspo/pipeline/plan.py) apply to every job;
  `constraint` and `gpu_type` describe a GPU node and apply to GPU jobs only;
- `cpu` replaces any of them for the CPU-only jobs (prepare, tables, figures, report, and the
  train and evaluate jobs of a class with `gpus: 0`);
- `sizes.<class>` replaces any of them for the train and evaluate jobs of that size class (a
  constraint for the 8B jobs' larger cards; `constraint` and `gpu_type` for its GPU jobs only).

A key set to null in `cpu` or `sizes` unsets it there: the cluster's default. The keys become the
plugin's resources `slurm_partition`, `slurm_account`, `qos` and `constraint`; `gpu_type` a GPU
request `gres=gpu:<type>:<GPUs per node>`; `reservation` and `extra` are appended to the job's
`slurm_extra` after the project's own options (the trainer's warning signal), each word quoted for
the shell (the plugin puts slurm_extra into its sbatch command line as it is). Options the plugin
sets itself, and the warning signal, are refused in `extra` under any spelling sbatch accepts
(`sbatch_options`), naming the key that sets them; an account or qos naming several is refused.
"""

from __future__ import annotations

import shlex

JOB_KEYS = ("partition", "account", "qos", "reservation", "constraint", "gpu_type", "extra", "max_runtime")
GPU_NODE_KEYS = ("constraint", "gpu_type")  # what a CPU-only job leaves out, unless `cpu` sets it
# The plugin's resources that these keys become (and `gpu`/`gres`, `slurm_extra`).
RESOURCES = {"partition": "slurm_partition", "account": "slurm_account", "qos": "qos", "constraint": "constraint"}
# The sbatch options that `extra` may not carry, by their long name: those the plugin sets itself
# (snakemake_executor_plugin_slurm's `get_forbidden_slurm_options`) and those bfspo sets, with what to
# use instead. `extra` is read as sbatch reads its options (`sbatch_options`): a long option by any
# unique prefix (`--partit=`, `--sig=`), a short one with its value attached (`-t1`, `-Aother`) or
# among others (`-vt1`), so no other spelling gets past.
PLUGIN = "the Slurm plugin sets it itself"
REFUSED = {
    "account": "use slurm.account", "partition": "use slurm.partition", "qos": "use slurm.qos",
    "constraint": "use slurm.constraint", "gres": "use slurm.gpu_type", "gpus": "use slurm.gpu_type",
    "gpus-per-node": "use slurm.gpu_type", "gpus-per-task": "use slurm.gpu_type",
    "gpus-per-socket": "use slurm.gpu_type", "time": "use the size class's train_runtime / eval_runtime",
    "mem": "use the size class's mem_mb", "mem-per-cpu": "use the size class's mem_mb",
    "mem-per-gpu": "use the size class's mem_mb", "cpus-per-gpu": "use the size class's cpus_per_gpu",
    "nodes": "use the size class's nodes", "signal": "bfspo sets the trainer's warning signal from the GPU plan",
    "reservation": "use slurm.reservation",
    **dict.fromkeys(["job-name", "output", "error", "parsable", "export", "comment", "chdir", "workdir",
                     "ntasks", "ntasks-per-gpu", "cpus-per-task", "clusters"], PLUGIN),
}
# sbatch's short options that take a value, and the long option of those that REFUSED holds
SHORT_VALUE = set("aAbBcCdDeFGiJLmMnNopqStwx")
SHORT_LONG = {"A": "account", "p": "partition", "q": "qos", "C": "constraint", "G": "gpus", "t": "time",
              "N": "nodes", "J": "job-name", "o": "output", "e": "error", "D": "chdir", "n": "ntasks",
              "c": "cpus-per-task", "M": "clusters"}
# A name that holds more than one value where sbatch takes one: the plugin submits only the first
SINGLE_NAMES = ("account", "qos")
UNSET = "(default)"  # how a plan shows a partition the cluster chooses


def settings(config: dict, gpu_job: bool, size: str | None = None) -> dict:
    """The `slurm` keys of one job (only those set): the top level, then `cpu` for a CPU-only job,
    then `sizes[size]` for a train or evaluate job of that size class (its GPU node keys for a GPU
    job only: the rehearsal turns every class into a CPU class and keeps the paper's `slurm`)."""
    slurm = config.get("slurm") or {}
    out = {k: slurm.get(k) for k in JOB_KEYS}
    if not gpu_job:
        out |= dict.fromkeys(GPU_NODE_KEYS) | (slurm.get("cpu") or {})
    if size is not None:
        keys = (slurm.get("sizes") or {}).get(size) or {}
        out |= {k: v for k, v in keys.items() if gpu_job or k not in GPU_NODE_KEYS}
    return {k: v for k, v in out.items() if v is not None}


def gpu_request(gpus: int, nodes: int = 1, gpu_type: str | None = None) -> dict:
    """The GPUs of a job as the plugin's resources: `gpu` (sbatch --gpus, the whole job's) on one node
    without a type; else `gres` (sbatch --gres, per node): gpu:<n> or gpu:<type>:<n>."""
    if not gpus:
        return {"gpu": None, "gres": None}
    if nodes == 1 and not gpu_type:
        return {"gpu": gpus, "gres": None}
    return {"gpu": None, "gres": f"gpu:{gpu_type}:{gpus}" if gpu_type else f"gpu:{gpus}"}


def extra_words(text: str | None) -> list[str]:
    """`extra` as shell words (a string that shlex cannot split is refused by `problems`)."""
    return shlex.split(text) if text else []


def slurm_extra(own: list[str], s: dict) -> str | None:
    """The job's `slurm_extra`: the project's own options, then --reservation, then the user's
    `extra`, every word quoted for the shell; None when there are none."""
    words = list(own) + ([f"--reservation={s['reservation']}"] if s.get("reservation") else [])
    words += extra_words(s.get("extra"))
    return " ".join(shlex.quote(w) for w in words) or None


def resources(config: dict, gpu_job: bool, size: str | None = None, gpus: int = 0, nodes: int = 1,
              own_extra: tuple[str, ...] = ()) -> dict:
    """Every resource a job's Slurm keys and GPUs give it; None where a key is unset (Snakemake
    leaves a resource out when its function returns None)."""
    s = settings(config, gpu_job, size)
    return ({RESOURCES[k]: s.get(k) for k in RESOURCES} | gpu_request(gpus, nodes, s.get("gpu_type"))
            | {"slurm_extra": slurm_extra(list(own_extra), s)})


def problems(config: dict) -> list[str]:
    """What the schema cannot check in `slurm`: size classes that exist, no GPU type for the CPU-only
    jobs, and `extra` strings that split into words and carry no option set elsewhere."""
    slurm = config.get("slurm") or {}
    out = []
    classes = config.get("resources") or {}
    if "gpu_type" in (slurm.get("cpu") or {}):
        out.append("slurm.cpu.gpu_type: CPU-only jobs ask for no GPU")
    out += [f"slurm.sizes.{size}: unknown size class '{size}' (known: {', '.join(classes)})"
            for size in slurm.get("sizes") or {} if size not in classes]
    places = [("slurm.extra", slurm.get("extra")), ("slurm.cpu.extra", (slurm.get("cpu") or {}).get("extra"))]
    places += [(f"slurm.sizes.{k}.extra", (v or {}).get("extra")) for k, v in (slurm.get("sizes") or {}).items()]
    for where, text in places:
        if text:
            out += _extra_problems(where, text)
    return out + _name_problems(slurm)


def sbatch_options(words: list[str]) -> list[tuple[str, list[str]]]:
    """(the word, the long options it may set) for each option among `words`, read as sbatch's getopt
    reads them: `--name[=value]` is the REFUSED option `name` or any of which it is a prefix (sbatch
    takes a unique prefix, and refuses an ambiguous one); `-xyz` is short options, each taking the
    rest of the word (or the next word) as its value when it takes one (SHORT_VALUE)."""
    out, i = [], 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--") and len(word) > 2:
            name = word[2:].split("=", 1)[0]
            out.append((word, [name] if name in REFUSED else [o for o in REFUSED if o.startswith(name)]))
        elif word.startswith("-") and len(word) > 1:
            names = []
            for j, letter in enumerate(word[1:], start=2):
                if letter in SHORT_LONG:
                    names.append(SHORT_LONG[letter])
                if letter in SHORT_VALUE:
                    i += j == len(word)  # the value is the next word
                    break
            out.append((word, names))
    return out


def _extra_problems(where: str, text: str) -> list[str]:
    try:
        words = shlex.split(text)
    except ValueError as e:
        return [f"{where}: {text!r} does not split into sbatch options ({e})"]
    out = []
    for word, names in sbatch_options(words):
        if not names:
            continue
        shown = word.split("=", 1)[0]
        long = " or ".join(f"--{n}" for n in names)
        spelt = ("" if [shown] == [f"--{n}" for n in names] else
                 f" (an abbreviation of {long})" if shown.startswith("--") else f" (sbatch reads it as {long})")
        why = "; ".join(dict.fromkeys(REFUSED[n] for n in names))
        out.append(f"{where}: {shown!r} is not allowed here{spelt} ({why})")
    return out


def _name_problems(slurm: dict) -> list[str]:
    """A comma in an account or a qos: sbatch takes one of each, and the plugin would submit the first."""
    places = [("slurm", slurm), ("slurm.cpu", slurm.get("cpu") or {})]
    places += [(f"slurm.sizes.{k}", v or {}) for k, v in (slurm.get("sizes") or {}).items()]
    return [f"{where}.{key}: {block[key]!r} names more than one; sbatch takes one {key}"
            for where, block in places for key in SINGLE_NAMES if "," in str(block.get(key) or "")]


def unset_line(config: dict, source: str) -> str | None:
    """One line saying which of partition and account are unset (None when both are set), where the
    jobs then go, and how to set them."""
    slurm = config.get("slurm") or {}
    unset = [k for k in ("partition", "account") if not slurm.get(k)]
    if not unset:
        return None
    what = " and ".join(unset)
    keys = " and ".join(f"slurm.{k}" for k in unset)
    return (f"Slurm: no {what} set, so jobs go to the cluster's default {what}; set {keys} in {source} "
            "(config/README.md, \"slurm\")")
