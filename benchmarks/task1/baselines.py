"""Non-neural baselines on the RTE data (train on train.tsv, score on dev.tsv).

* majority: always the most frequent training label;
* bag-of-words: logistic regression on word counts (uni+bigrams) of the hypothesis and of
  the premise (separate vocabularies), so it can learn "this word in the hypothesis";
* hypothesis length: a depth-3 tree on the number of words of the hypothesis;
* overlap + length: boosted trees on word-overlap features (share of hypothesis words found
  in the premise, number of new words, lengths) -- the "lexical overlap" heuristic.

    python benchmarks/task1/baselines.py [--data_dir data/glue_data/RTE]

Needs scikit-learn (in the kit's environment).
"""

import argparse
import json
import re
from pathlib import Path

import numpy as np
from scipy.sparse import hstack
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier


def read(path):
    rows = [line.rstrip("\n").split("\t") for line in open(path, encoding="utf-8")][1:]
    return [r[1] for r in rows], [r[2] for r in rows], np.array([r[3] == "entailment" for r in rows], int)


def words(text):
    return re.findall(r"[a-z0-9]+", text.lower())


def overlap_features(p, h):
    pw, hw = set(words(p)), words(h)
    new = [w for w in hw if w not in pw]
    return [len(new), len(new) / max(len(hw), 1), len(hw), len(words(p)),
            sum(w.isdigit() for w in new), int(any(w in ("not", "never") for w in hw)),
            int(any(w in ("not", "never", "declined", "refused") for w in pw))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data_dir", default="data/glue_data/RTE")
    a = ap.parse_args()
    d = Path(a.data_dir)
    tp, th, ty = read(d / "train.tsv")
    dp, dh, dy = read(d / "dev.tsv")
    out = {"majority": float(np.mean(dy == np.bincount(ty).argmax()))}

    vh = CountVectorizer(ngram_range=(1, 2), token_pattern=r"[A-Za-z0-9]+")
    vp = CountVectorizer(ngram_range=(1, 2), token_pattern=r"[A-Za-z0-9]+")
    Xt = hstack([vh.fit_transform(th), vp.fit_transform(tp)]).tocsr()
    Xd = hstack([vh.transform(dh), vp.transform(dp)]).tocsr()
    lr = LogisticRegression(max_iter=5000, C=1.0).fit(Xt, ty)
    out["bag_of_words_logreg"] = float(lr.score(Xd, dy))
    lr_h = LogisticRegression(max_iter=5000, C=1.0).fit(vh.transform(th), ty)
    out["bag_of_words_hypothesis_only"] = float(lr_h.score(vh.transform(dh), dy))

    ln = lambda hs: np.array([[len(words(h))] for h in hs])
    out["hypothesis_length_tree"] = float(DecisionTreeClassifier(max_depth=3, random_state=0)
                                          .fit(ln(th), ty).score(ln(dh), dy))
    Ft = np.array([overlap_features(p, h) for p, h in zip(tp, th)])
    Fd = np.array([overlap_features(p, h) for p, h in zip(dp, dh)])
    gb = GradientBoostingClassifier(random_state=0).fit(Ft, ty)
    out["overlap_length_boosted_trees"] = float(gb.score(Fd, dy))
    print(json.dumps({k: round(v, 4) for k, v in out.items()}, indent=2))


if __name__ == "__main__":
    main()
