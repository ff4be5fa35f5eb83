"""The served intent classifier before and after its calibration (`calibration.json`, fitted by
`queryserve prepare` on MASSIVE's validation split), measured on the test split, which the fit
never reads: accuracy overall and on `play_music`, ECE and NLL, the share of queries at or
above the confidence threshold and how often those above and below it are right; the threshold
other precision targets would have chosen; and what intent, at what confidence, the model gives
music-style queries ("<artist> <title>", songs of data/billboard-hot100).

Run: `python benchmarks/intent_calibration.py` (seconds on 2 cores). Prints markdown tables.
The "before" probabilities are the served ones with the temperature undone, p ** T renormalised:
the graph's own, to float32's precision.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from queryserve.intent.calibration import (  # noqa: E402
    TARGET_PRECISION,
    confidence_threshold,
    expected_calibration_error,
    label_ids,
    negative_log_likelihood,
    scaled,
    served_probabilities,
)
from queryserve.intent.train import DATA, load_massive  # noqa: E402
from queryserve.pipelines.calibration import load_calibration  # noqa: E402
from queryserve.types import Array  # noqa: E402

MUSIC = "play_music"
# "<artist> <title>" as typed into a search bar: songs of the Billboard catalog the search page
# serves, lower-case; the two first (the second is what /v1/search's spell step turns
# into the first before intent runs). Then two in MASSIVE's own phrasing, and a clear intent.
QUERIES = (
    "taylor swift shake it off", "taylor swfit shak it off", "the weeknd blinding lights",
    "lil nas x old town road", "billie eilish bad guy", "mark ronson uptown funk",
    "adele hello", "luis fonsi despacito", "adele rolling in the deep",
    "pharrell williams happy", "ed sheeran shape of you", "dua lipa levitating",
    "miley cyrus flowers", "outkast hey ya", "rihanna umbrella", "eminem lose yourself",
    "drake hotline bling", "beyonce crazy in love",
    "play shake it off by taylor swift", "play blinding lights by the weeknd",
    "wake me up at seven",
)
TARGETS = (0.85, TARGET_PRECISION, 0.95)


def share(flags: Array) -> str:
    return f"{flags.mean():.1%}" if len(flags) else "-"


def figures(raw: Array, calibrated: Array, labels: Array, threshold: float) -> list[str]:
    right = calibrated.argmax(axis=1) == labels
    above = calibrated.max(axis=1) >= threshold
    changed = int((raw.argmax(axis=1) != calibrated.argmax(axis=1)).sum())
    return [f"{len(labels):,}", f"{(raw.argmax(axis=1) == labels).mean():.1%}",
            f"{right.mean():.1%}", str(changed),
            f"{expected_calibration_error(raw, labels):.4f}",
            f"{expected_calibration_error(calibrated, labels):.4f}",
            f"{negative_log_likelihood(raw, labels):.4f}",
            f"{negative_log_likelihood(calibrated, labels):.4f}",
            share(above), share(right[above]), share(right[~above])]


def table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, nargs="?", default=ROOT / "model_repository/intent",
                        help="the served intent model's folder (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=ROOT / DATA, help="MASSIVE's splits")
    args = parser.parse_args()
    calibration = load_calibration(args.model)
    if calibration is None:
        sys.exit(f"{args.model} holds no calibration.json: run `queryserve prepare`")
    massive = load_massive(args.data)
    music = massive.names.index(MUSIC)
    splits = {}
    for name, split in (("validation (the fit's)", massive.validation),
                        ("test", massive.test)):
        calibrated = served_probabilities(args.model, split.texts)
        splits[name] = (scaled(calibrated, 1 / calibration.temperature), calibrated,
                        label_ids(args.model, massive.names, split.labels),
                        np.array(split.labels) == music)
    print(f"temperature {calibration.temperature:.4f}, threshold {calibration.threshold:.4f} "
          f"(`{args.model}/calibration.json`)\n")
    rows = []
    for name, (raw, calibrated, labels, is_music) in splits.items():
        rows.append([name, *figures(raw, calibrated, labels, calibration.threshold)])
        rows.append([f"{name}, {MUSIC} only",
                     *figures(raw[is_music], calibrated[is_music], labels[is_music],
                              calibration.threshold)])
    table(["split", "queries", "accuracy before", "after", "argmax changed", "ECE before",
           "ECE after", "NLL before", "NLL after", "at/above threshold",
           "accuracy above", "accuracy below"], rows)

    queries = list(QUERIES)
    calibrated = served_probabilities(args.model, queries)
    raw = scaled(calibrated, 1 / calibration.temperature)
    names = label_ids(args.model, massive.names, list(range(len(massive.names))))
    served = {int(column): massive.names[i] for i, column in enumerate(names)}
    table(["query", "intent", "probability before", "calibrated", "confident"], [
        [q, served[int(c.argmax())], f"{r.max():.3f}", f"{c.max():.3f}",
         "yes" if c.max() >= calibration.threshold else "**no**"]
        for q, r, c in zip(queries, raw, calibrated, strict=True)])

    _, validation, validation_labels, _ = splits["validation (the fit's)"]
    _, test, test_labels, _ = splits["test"]
    rows = []
    for target in TARGETS:
        threshold = confidence_threshold(validation, validation_labels, target)
        above = test.max(axis=1) >= threshold
        right = test.argmax(axis=1) == test_labels
        unsure = sum(c.max() < threshold for c in calibrated)
        rows.append([f"{target:.0%}" + (" (served)" if target == TARGET_PRECISION else ""),
                     f"{threshold:.3f}", share(above), share(right[above]),
                     share(right[~above]), f"{unsure} of {len(queries)}"])
    table(["precision target (validation)", "threshold", "test at/above", "test accuracy above",
           "test accuracy below", "queries above not confident"], rows)


if __name__ == "__main__":
    main()
