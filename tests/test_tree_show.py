"""`bfspo tree show`: logged trees rendered as text, backtracking tokens marked [[...]] as in Fig. 5;
`bfspo tree stats`: where their training signal goes."""

import re

import pytest

from bfspo.algorithm.advantages import assign_advantages, assign_rewards
from bfspo.algorithm.tree import SearchTree
from bfspo.cli import main
from bfspo.io import write_jsonl
from bfspo.reporting.tree_stats import tree_stats

WORDS = {1: "<eos>", 2: "Let", 3: "'s", 4: " count", 5: " pieces", 6: " are", 7: " left", 8: " 4",
         9: " her", 10: " ate", 11: " 5"}


def decode(ids):
    return [WORDS[i] for i in ids]


def logged_tree():
    """o_1 = Let's count pieces are left 4 <eos>; w^b = ' pieces'; the new branch ' her ate 4 <eos>'."""
    t = SearchTree(prompt_ids=[50, 51, 52], budget=12)
    s = t.add_completion(None, [2, 3, 4, 5, 6, 7, 8, 1], [-0.1] * 8, [0.1, 0.1, 0.1, 0.1, 2.0, 0.1, 0.1, 0.1], True, 0)
    w = t.add_completion(None, [2, 11, 1], [-0.1] * 3, [0.1] * 3, True, 0)
    t.segments[s].leaf.correct = True
    b = t.split(s, 3)
    t.segments[b].ends_in_B = True
    n = t.add_completion(b, [9, 8, 1], [-0.2] * 3, [0.3] * 3, True, 1)
    t.segments[n].leaf.correct = True
    t.selected = [{"iteration": 1, "leaf": s, "length": 8}]
    t.backtracking = [{"iteration": 1, "depth": 4, "path_length": 8, "entropy": 2.0, "leaf": s, "segment": b}]
    assign_rewards(t, overlong=False)
    assign_advantages(t, "branch")
    t.meta = {"question": "pies"}
    return t, dict(s=s, w=w, b=b, n=n)


def test_render_marks_backtracking_tokens_and_lists_the_selected_paths(tmp_path, capsys):
    t, ids = logged_tree()
    path = tmp_path / "step_00001.jsonl"
    write_jsonl(path, [t.to_dict(decode), t.to_dict()])
    assert main(["tree", "show", str(path), "--index", "0"]) == 0
    out = capsys.readouterr().out
    assert "3 leaves (2 correct)" in out
    assert "expansion 1: w^b at depth 4 on a path of 8 tokens (leaf 0), entropy 2.000" in out
    assert "o_1 (leaf 0, 8 tokens): \"Let's count[[ pieces]] are left 4<eos>\"" in out
    assert "best (leaf 3, 7 tokens): \"Let's count[[ pieces]] her 4<eos>\"" in out
    # the outline: w^b's segment first, its two children indented below it
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("- seg 2"))
    assert "\"Let's count[[ pieces]]\"" in lines[first]
    assert lines[first + 1].startswith("  - seg 0") and "leaf correct, 8 tokens" in lines[first + 1]
    assert lines[first + 2].startswith("  - seg 3") and "' her 4<eos>'" in lines[first + 2]
    assert lines[first + 3].startswith("- seg 1") and "leaf wrong" in lines[first + 3]
    # without logged text (and no tokenizer) token ids are shown
    assert main(["tree", "show", str(path), "--index", "1"]) == 0
    assert "<2><3><4>[[<5>]]" in capsys.readouterr().out
    assert main(["tree", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("selected paths") == 2 and "tree 1:" in out


def test_bad_files_and_indexes_are_clear_errors(tmp_path, capsys):
    t, _ = logged_tree()
    path = tmp_path / "trees.jsonl"
    write_jsonl(path, [t.to_dict(decode)])
    assert main(["tree", "show", str(path), "--index", "3"]) == 2
    assert "out of range" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, [{"hello": 1}])
    assert main(["tree", "show", str(bad)]) == 2
    assert "bad.jsonl:1: not a logged search tree" in capsys.readouterr().err
    assert main(["tree", "show", str(tmp_path / "missing.jsonl")]) == 2


def test_tokenizer_decodes_trees_logged_without_text(tmp_path, capsys, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok("Tom has 3 apples.")["input_ids"]
    t = SearchTree(prompt_ids=[0], budget=len(ids) + 1)
    t.add_completion(None, ids, [0.0] * len(ids), [0.0] * len(ids), False, 0)
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [t.to_dict()])
    assert main(["tree", "show", str(path), "--tokenizer", str(tiny_model_dir)]) == 0
    assert "'Tom has 3 apples.'" in capsys.readouterr().out
    assert main(["tree", "show", str(path), "--tokenizer", str(tmp_path / "nope")]) == 2
    assert "tokenizer" in capsys.readouterr().err


def records(*dicts):
    """What `read_trees` yields for these logged records."""
    return [(d, SearchTree.from_dict(d)) for d in dicts]


NONE_OF = {f"{stat}_{kind}": None for kind in ("all_correct", "all_wrong") for stat in (
    "best_branch_advantage", "best_branch_dapo_advantage", "best_branch_negative", "other_correct_advantage")}


def test_stats_of_a_hand_worked_tree(tmp_path, capsys):
    """logged_tree(): root children b (expanded; children s and n, both correct) and w (wrong).
    R(b) = 1, R(w) = -1, so A(b) = (1 - 0) / std(1, -1) = 1 / sqrt(2); below b both children are
    worth 1: sigma = 0, advantage 0. Initial leaves s (correct, 8 tokens) and w (wrong); the one
    expansion leaf n is correct with 7 tokens; w^b sits at depth 4 of an 8-token path."""
    t, ids = logged_tree()
    run = tmp_path / "run"
    write_jsonl(run / "trees" / "step_00001.jsonl", [t.to_dict(decode)])
    stats = tree_stats(records(t.to_dict(decode)))
    assert stats.pop("wb_tokens") == [(" pieces", 1.0)]
    mixed = {"best_branch_advantage": 2 ** -0.5, "best_branch_dapo_advantage": 2 ** -0.5,  # DAPO: s in (s, w)
             "best_branch_negative": 0.0, "other_correct_advantage": None}
    assert stats == pytest.approx({
        "trees": 1, "filtered": 0, "trees_mixed": 1, "trees_all_correct": 0, "trees_all_wrong": 0,
        "first_all_correct": 0.0, "branching_nodes": 2, "equal_children": 0.5,
        **{f"{k}_mixed": v for k, v in mixed.items()}, **NONE_OF, **{f"{k}_all": v for k, v in mixed.items()},
        "initial_accuracy": 0.5, "expansion_accuracy": 1.0, "shortening": 1, "wb_relative_depth": 0.5}, abs=1e-5)
    assert tree_stats(records(t.to_dict()))["wb_tokens"] == []  # logged without text
    assert main(["tree", "stats", str(run)]) == 0
    out = capsys.readouterr().out
    assert "equal_children                           0.500" in out
    assert "best_branch_advantage_mixed              0.707" in out and "best_branch_advantage_all_correct        -" in out
    assert "wb_tokens                                ' pieces' 100%" in out
    assert "trees                                    1\n" in out and "trees_all_correct                        0\n" in out


def expanded_tree(first, expansion):
    """G first answers of 5 tokens (correct flags `first`); the first one split after its first token
    (w^b) and expanded with G answers (flags `expansion`) of 2 more tokens (3 in all: shorter than any
    first answer); +-1 rewards, Eq. 9."""
    t = SearchTree(prompt_ids=[50], budget=16)
    ids = []
    for ok in first:
        ids.append(t.add_completion(None, [2, 3, 4, 5, 1], [-0.1] * 5, [0.1, 2.0, 0.1, 0.1, 0.1], True, 0))
        t.segments[ids[-1]].leaf.correct = ok
    b = t.split(ids[0], 0)
    t.segments[b].ends_in_B = True
    for ok in expansion:
        n = t.add_completion(b, [9, 1], [-0.2] * 2, [0.3] * 2, True, 1)
        t.segments[n].leaf.correct = ok
    t.backtracking = [{"iteration": 1, "depth": 1, "path_length": 5, "entropy": 2.0, "leaf": ids[0], "segment": b}]
    assign_rewards(t, overlong=False)
    assign_advantages(t, "branch")
    return t


def test_stats_count_every_kind_of_first_group_by_hand():
    """Issue 25: every kept tree counts, each kind of first group on its own line.
    - mixed: logged_tree() above: A(best branch) = 1/sqrt 2, DAPO's Eq. 1 on (s, w) the same.
    - all correct (G = 4), the first answer expanded with 4 answers, one wrong: the root's children
      are worth 1, 1, 1 and r = (1 + 3 - 1) / 5 = 0.6; Eq. 9 gives the expanded branch
      -(G - 1) / sqrt G = -1.5 and each sibling +1 / sqrt G = +0.5; DAPO drops the group: 0.
    - all wrong (G = 2), rescued without BFS by one correct answer of 2 expansion answers: w^b's
      children are -1, +1, -1 (mean -1/3), the root's -1/3 and -1: A = +1/sqrt 2; DAPO drops it: 0.
    A tree whose first answers are all correct and whose expansions all succeed is filtered out."""
    mixed = logged_tree()[0]
    all_correct = expanded_tree([True] * 4, [True, True, False, True])
    all_wrong = expanded_tree([False] * 2, [True, False])
    useless = expanded_tree([True] * 4, [True] * 4)
    stats = tree_stats(records(*[t.to_dict() for t in (mixed, all_correct, all_wrong, useless)]))
    s2 = 2 ** -0.5
    assert stats["best_branch_advantage_all_correct"] == pytest.approx(-1.5, rel=1e-5)
    expected = {
        "trees": 3, "filtered": 1, "trees_mixed": 1, "trees_all_correct": 1, "trees_all_wrong": 1,
        "first_all_correct": 1 / 3,
        "best_branch_advantage_mixed": s2, "best_branch_dapo_advantage_mixed": s2,
        "best_branch_dapo_advantage_all_correct": 0.0, "best_branch_negative_all_correct": 1.0,
        "other_correct_advantage_all_correct": 0.5,
        "best_branch_advantage_all_wrong": s2, "best_branch_dapo_advantage_all_wrong": 0.0,
        "best_branch_negative_all_wrong": 0.0, "other_correct_advantage_all_wrong": None,
        "best_branch_advantage_all": (s2 - 1.5 + s2) / 3, "best_branch_dapo_advantage_all": s2 / 3,
        "best_branch_negative_all": 1 / 3, "other_correct_advantage_all": 0.5}
    assert {k: stats[k] for k in expected} == pytest.approx(expected, abs=1e-5)


def test_stats_skip_filtered_trees_and_name_bad_paths(tmp_path, capsys):
    t, ids = logged_tree()
    t.segments[ids["w"]].leaf.correct = True  # every leaf correct: dynamic sampling drops the tree
    assert tree_stats(records(t.to_dict()))["filtered"] == 1
    assert tree_stats(records(t.to_dict()))["trees"] == 0
    assert main(["tree", "stats", str(tmp_path / "missing")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["tree", "stats", str(tmp_path / "empty")]) == 2
    assert "log_trees" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"segments": 1}\n')
    assert main(["tree", "stats", str(tmp_path / "bad.jsonl")]) == 2
    assert "bad.jsonl:1: not a logged search tree" in capsys.readouterr().err


def test_tree_text_keeps_characters_split_over_byte_tokens(tiny_model_dir, tmp_path, capsys):
    """Issue 22: a byte-level BPE spreads `÷` and `≈` over two tokens each, and each decodes alone to
    `�`. Token texts come from the decoded prefix: the logged text, `bfspo tree show --tokenizer`
    and the W&B sample table (which renders the logged text) show the characters, even where a
    backtracking token splits one."""
    from functools import partial

    from transformers import AutoTokenizer

    from bfspo.detokenize import token_texts

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    text = "So 3 ÷ 4 ≈ 0.75 here<|im_end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    alone = [tok.decode([i]) for i in ids]
    assert alone.count("\ufffd") >= 4  # the bug: each byte of ÷ and ≈ decoded alone
    texts = token_texts(tok, ids)
    assert len(texts) == len(ids) and "".join(texts) == text and "\ufffd" not in "".join(texts)
    assert sum(t.endswith(("÷", "≈")) for t in texts) == 2
    assert texts.count("") == len("÷".encode()) - 1 + len("≈".encode()) - 1  # the bytes before each last one

    cut = alone.index("\ufffd")  # w^b is the first byte of ÷: the character is split across segments
    t = SearchTree(prompt_ids=[1, 2], budget=len(ids) + 4)
    s = t.add_completion(None, ids, [-0.1] * len(ids), [0.1] * len(ids), True, 0)
    b = t.split(s, cut)
    t.segments[b].ends_in_B = True
    t.add_completion(b, ids[cut + 1:], [-0.1] * (len(ids) - cut - 1), [0.1] * (len(ids) - cut - 1), True, 1)
    t.segments[s].leaf.correct = True
    t.selected = [{"iteration": 1, "leaf": s, "length": len(ids)}]
    logged = t.to_dict(partial(token_texts, tok))
    assert "".join(logged["segments"][b]["text"] + logged["segments"][s]["text"]) == text
    path = tmp_path / "trees.jsonl"
    write_jsonl(path, [logged, t.to_dict()])
    for args in (["--index", "0"], ["--index", "1", "--tokenizer", str(tiny_model_dir)]):
        assert main(["tree", "show", str(path), *args]) == 0
        out = capsys.readouterr().out
        assert "÷ 4 ≈ 0.75" in out and "\ufffd" not in out


def test_stats_print_a_legend_of_every_key_also_in_help(tmp_path, capsys):
    """Issue 33: `tree stats` printed bare keys, and its --help listed only `paths`."""
    from bfspo.reporting.tree_stats import KINDS, MEANINGS

    t, _ = logged_tree()
    stats = tree_stats(records(t.to_dict(decode)))
    generic = {k if k in MEANINGS else re.sub(f"_({'|'.join(KINDS)}|all)$", "_KIND", k) for k in stats}
    assert generic == set(MEANINGS)
    run = tmp_path / "run"
    write_jsonl(run / "trees" / "step_00001.jsonl", [t.to_dict(decode)])
    assert main(["tree", "stats", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count("legend (KIND: mixed, all_correct, all_wrong, all):") == 1
    assert "  best_branch_negative_KIND: share of those best branches with a negative Eq. 9 advantage" in out
    assert "  KIND all_wrong: every first sample wrong" in out
    with pytest.raises(SystemExit):
        main(["tree", "stats", "--help"])
    help_text = capsys.readouterr().out
    assert all(f"  {key}: " in help_text for key in MEANINGS)


def _damaged(edit):
    d = logged_tree()[0].to_dict()
    edit(d)
    return d


@pytest.mark.parametrize("edit, named", [
    (lambda d: d["segments"][2]["children"].append(2), "segment 2 lists segment 2 again"),
    (lambda d: d["segments"][0].update(children=[2]), "segment 0 lists segment 2 again"),
    (lambda d: d["segments"][2]["children"].append(99), "segment 2 lists child 99, not a segment of the 4"),
    (lambda d: d["root_children"].append(-1), "the root lists child -1, not a segment of the 4"),
    (lambda d: d.update(root_children=[1]), "segment 0 is not reached from the root"),
], ids=["self-child", "cycle", "child-out-of-range", "negative-child", "unreached"])
@pytest.mark.parametrize("command", ["show", "stats"])
def test_a_tree_whose_segments_hold_a_cycle_is_refused_naming_it(tmp_path, edit, named, command):
    """Issue 46: `bfspo tree show` looped forever (1.7 GB in 60 s) on a tree file in which a segment
    lists itself among its children; the tree reader now refuses cycles and children out of range,
    for `show` and `stats` alike, naming the file, the line and the segment."""
    import subprocess
    import sys

    from tests.helpers import process

    path = tmp_path / "step_00001.jsonl"
    write_jsonl(path, [logged_tree()[0].to_dict(), _damaged(edit)])
    try:
        proc = process.run([sys.executable, "-m", "bfspo.cli", "tree", command, str(path)], timeout=60,
                           capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"bfspo tree {command} did not end on a damaged tree")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}:2: not a logged search tree (ValueError: {named}" in proc.stderr + proc.stdout
