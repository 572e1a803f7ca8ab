"""The partial output of `bfspo evaluate`, so that an interrupted evaluation resumes where it stopped.

Questions are generated in fixed batches. After each batch, one line is appended to
DIR/samples.partial.jsonl, flushed and fsynced: the batch's index, question ids, generation seconds
and scored samples. The file's first line holds the settings of the evaluation (what was evaluated,
how, and the content fingerprints of the model, adapter and data: bfspo.fingerprint). A rerun with
the same settings keeps the batches already written and generates only the others; with other
settings it starts over.
A kill can tear only the last line: that batch is generated again. The name never looks finished:
samples.jsonl and summary.json are written only when every batch is done, and the partial file is
then removed.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

from bfspo.io import append_line, atomic_write_text, read_jsonl

PARTIAL_NAME = "samples.partial.jsonl"


class Progress:
    """The batches of one evaluation already generated, read from DIR/samples.partial.jsonl, and the
    appending of new ones.

    settings: everything the samples depend on (compared as JSON with the file's first line).
    batches: the question ids of each batch, in generation order (a batch on file with other ids is
    not reused).
    """

    def __init__(self, out_dir: Path, settings: dict, batches: list[list]):
        self.path = Path(out_dir) / PARTIAL_NAME
        self.settings = json.loads(json.dumps(settings))
        self.done: dict[int, dict] = self._read(batches)
        header = json.dumps({"settings": self.settings}) + "\n"
        atomic_write_text(self.path, header + "".join(json.dumps(self.done[k]) + "\n" for k in sorted(self.done)))
        if self.done:
            questions = sum(len(r["ids"]) for r in self.done.values())
            tqdm.write(f"{self.path}: resuming, {len(self.done)} of {len(batches)} batches "
                       f"({questions} questions) already done")

    def _read(self, batches: list[list]) -> dict[int, dict]:
        if not self.path.exists():
            return {}
        skipped: list[dict] = []
        lines = list(read_jsonl(self.path, skipped=skipped))
        if not lines or lines[0][1].get("settings") != self.settings:
            tqdm.write(f"{self.path}: partial output of other settings (model, adapter, data or protocol), "
                       "starting over")
            return {}
        for bad in skipped:
            tqdm.write(f"{self.path}:{bad['line']}: {bad['problem']} (a batch cut short by a kill), generated again")
        done = {}
        for _, record in lines[1:]:
            k = record.get("batch")
            if isinstance(k, int) and 0 <= k < len(batches) and record.get("ids") == batches[k]:
                done[k] = record
        return done

    def record(self, batch: int, ids: list, seconds: float, samples: list[dict]) -> None:
        """Append one generated batch, on disk (fsynced) before this returns."""
        record = {"batch": batch, "ids": ids, "seconds": seconds, "samples": samples}
        append_line(self.path, json.dumps(record, ensure_ascii=False))
        self.done[batch] = record

    def remove(self) -> None:
        """Called once samples.jsonl and summary.json are written."""
        self.path.unlink(missing_ok=True)
