"""How one synthetic RTE example is drawn: a premise's facts, then a hypothesis per pattern.

``EntitySampler`` draws the distinct people, companies, places and numbers of one premise;
``render_premise_fact`` and ``background_sentence`` write the premise; ``hypothesis`` writes
the hypothesis for a pattern of ``PATTERNS``; ``generate_split`` makes a whole split. All
randomness comes from the one ``random.Random`` passed in, in a fixed order of draws.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

if __package__:  # imported as data_scripts.synthetic_rte_sentences
    from .synthetic_rte_vocab import (CITIES, CLAIMS, CLAUSES, FIRST_NAMES, LABELS, LAST_NAMES, MONTHS,
                                      NEEDS_ATTR, NEEDS_OTHER, NEGATED_PREMISE, ORG_ATTRS, ORG_HEADS, ORG_TAILS,
                                      ORG_VERBS, PATTERNS, PERSON_ATTRS, PERSON_VERBS, ROLES, YEARS, Verb, article)
else:  # run as a script from data_scripts/ (python data_scripts/make_synthetic_rte.py)
    from synthetic_rte_vocab import (CITIES, CLAIMS, CLAUSES, FIRST_NAMES, LABELS, LAST_NAMES, MONTHS,
                                     NEEDS_ATTR, NEEDS_OTHER, NEGATED_PREMISE, ORG_ATTRS, ORG_HEADS, ORG_TAILS,
                                     ORG_VERBS, PATTERNS, PERSON_ATTRS, PERSON_VERBS, ROLES, YEARS, Verb, article)

# ----------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class Fact:
    """One directional event: ``agent`` did ``verb`` to ``patient`` (people or companies)."""

    kind: str                # "person" or "org"
    agent: str
    patient: str
    verb: Verb
    form: int                # which paraphrase the premise uses
    time: tuple[str | None, int]  # (month or None, year)
    place: str | None        # people: where it happened
    amount: int | None       # companies: deal size in million dollars
    attr: tuple[str, str, str] | None  # (subject, attribute kind, value) shown as a clause
    negated: bool = False


class EntitySampler:
    """Draws the entities of one premise so they are all distinct, and remembers every value
    it used (the "pool") so overlap patterns can reuse words that appear in the premise."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()  # membership only; never iterated (PYTHONHASHSEED-proof)
        self.words: set[str] = set()  # words of the entities in the premise, likewise
        self.pool: dict[str, list[str]] = {"person": [], "org": [], "city": [], "year": [],
                                           "number": [], "role": []}

    def _fresh(self, draw, kind: str | None, new_words: int = 0) -> str:
        """Draw until the value is not yet used; with ``new_words``, its first words (a first
        name, a surname, a company's head word) must not occur in the premise either, so a
        changed entity is really a different one, not "Maria Costa" for "Maria Silva"."""
        while True:
            value = draw()
            if value in self.used or any(w in self.words for w in value.split()[:new_words]):
                continue
            self.used.add(value)
            if kind:
                self.pool[kind].append(value)
                self.words.update(value.split())
            return value

    def fresh(self, kind: str, remember: bool = True) -> str:
        r = self.rng
        draws = {
            "person": lambda: f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}",
            "org": lambda: f"{r.choice(ORG_HEADS)} {r.choice(ORG_TAILS)}",
            "city": lambda: r.choice(CITIES),
            "year": lambda: str(r.choice(YEARS)),
            "role": lambda: r.choice(ROLES),
            "age": lambda: str(r.randint(24, 79)),
            "staff": lambda: str(r.choice((40, 60, 85, 120, 150, 240, 300, 450, 600, 800, 1200,
                                           1500, 2000, 3500, 5000, 8000))),
            "amount": lambda: str(r.choice((5, 8, 12, 15, 20, 25, 30, 40, 45, 60, 75, 90, 120,
                                            150, 200, 250, 300, 400, 500, 650, 800))),
        }
        pool_kind = {"age": "number", "staff": "number", "amount": "number"}.get(kind, kind)
        if remember:
            return self._fresh(draws[kind], pool_kind)
        return self._fresh(draws[kind], None, new_words={"person": 2, "org": 1}.get(kind, 0))

    def attr_value(self, attr: str, remember: bool = True) -> str:
        kind = {"role": "role", "employer": "org", "age": "age", "hometown": "city",
                "hq": "city", "staff": "staff", "founded": "year"}[attr]
        return self.fresh(kind, remember)

    def fact(self, kind: str, with_attr: bool, negated: bool = False) -> Fact:
        r = self.rng
        verb = r.choice(PERSON_VERBS if kind == "person" else ORG_VERBS)
        agent, patient = self.fresh(kind), self.fresh(kind)
        month = r.choice(MONTHS) if r.random() < 0.4 else None
        time = (month, int(self.fresh("year")))
        place = self.fresh("city") if kind == "person" else None
        amount = int(self.fresh("amount")) if kind == "org" else None
        attr = None
        if with_attr:
            subject = agent if r.random() < 0.7 else patient
            name = r.choice(PERSON_ATTRS if kind == "person" else ORG_ATTRS)
            attr = (subject, name, self.attr_value(name))
        return Fact(kind, agent, patient, verb, r.randrange(len(verb.forms)), time, place,
                    amount, attr, negated)


def time_phrase(fact: Fact, with_month: bool = True) -> str:
    month, year = fact.time
    return f"in {month} {year}" if (month and with_month) else f"in {year}"


def detail_phrase(kind: str, value) -> str:
    return f"in a deal worth {value} million dollars" if kind == "amount" else f"in {value}"


def render_premise_fact(fact: Fact, rng: random.Random) -> str:
    """The fact as one premise sentence, with its attribute clause and details."""

    def name(who: str) -> str:
        if fact.attr and fact.attr[0] == who:
            _, attr, value = fact.attr
            return who + CLAUSES[attr].format(a=article(value), v=value)
        return who

    base, past = fact.verb.forms[fact.form]
    if fact.negated:
        verb = rng.choice((f"did not {base}", f"declined to {base}", f"refused to {base}"))
    else:
        verb = past
    details = []
    if fact.place:
        details.append(f"in {fact.place}")
    if fact.amount:
        details.append(detail_phrase("amount", fact.amount))
    time = time_phrase(fact)
    if rng.random() < 0.3:  # fronted time: "In 1998, A hired B in Lisbon."
        text = f"{time[0].upper()}{time[1:]}, {name(fact.agent)} {verb} {name(fact.patient)} {' '.join(details)}"
    else:
        text = f"{name(fact.agent)} {verb} {name(fact.patient)} {' '.join(details + [time])}"
    return " ".join(text.split()).rstrip(",") + "."


def background_sentence(ex: EntitySampler, fact: Fact) -> str:
    """A distractor sentence about one of the fact's entities, adding more words (and a
    city / year / number) to the premise without changing what the fact says."""
    r = ex.rng
    who = r.choice((fact.agent, fact.patient))
    if fact.kind == "person":
        options = (
            lambda: f"{who} had moved to {ex.fresh('city')} in {ex.fresh('year')}.",
            lambda: f"{who} previously spent {r.randint(2, 19)} years working in {ex.fresh('city')}.",
            lambda: f"The news was first reported by a local newspaper in {ex.fresh('city')}.",
            lambda: f"{who} studied in {ex.fresh('city')} before starting a career there.",
        )
    else:
        options = (
            lambda: f"{who} opened an office in {ex.fresh('city')} in {ex.fresh('year')}.",
            lambda: f"Shares of {who} rose by {r.randint(2, 19)} percent after the announcement.",
            lambda: f"Analysts in {ex.fresh('city')} had expected the move for months.",
            lambda: f"{who} reported revenue of {ex.fresh('amount')} million dollars last year.",
        )
    return r.choice(options)()


# ----------------------------------------------------------------------------- hypotheses


def relation(fact: Fact, rng: random.Random, agent=None, patient=None, negated=False,
             detail: tuple[str, object] | None = None, paraphrase: bool = True) -> str:
    """State "agent <verb> patient" in the active or passive voice, optionally negated and
    with one detail ("in Lisbon", "in 1998", "in a deal worth 40 million dollars")."""
    agent = agent or fact.agent
    patient = patient or fact.patient
    tail = f" {detail_phrase(*detail)}" if detail else ""
    if rng.random() < 0.45:  # passive voice
        pp = rng.choice(fact.verb.participles)
        return f"{patient} was {'not ' if negated else ''}{pp} by {agent}{tail}."
    forms = fact.verb.forms
    if paraphrase and len(forms) > 1 and rng.random() < 0.7:
        base, past = forms[rng.choice([i for i in range(len(forms)) if i != fact.form])]
    else:
        base, past = forms[fact.form]
    if negated:
        return f"{agent} {rng.choice(('did not ' + base, 'never ' + past))} {patient}{tail}."
    return f"{agent} {past} {patient}{tail}."


def claim(subject: str, attr: str, value: str, rng: random.Random) -> str:
    return rng.choice(CLAIMS[attr]).format(s=subject, a=article(value), v=value)


def fact_details(fact: Fact) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = [("year", fact.time[1])]
    if fact.place:
        out.append(("city", fact.place))
    if fact.amount:
        out.append(("amount", fact.amount))
    return out


def other_value(ex: EntitySampler, kind: str, current: str, prefer_pool: bool) -> str:
    """A value of the same kind that differs from ``current``: taken from the premise (high
    word overlap) when possible and asked for, otherwise a fresh one not in the premise."""
    pool_kind = {"amount": "number", "city": "city", "year": "year", "role": "role",
                 "age": "number", "staff": "number", "person": "person", "org": "org",
                 "employer": "org", "hometown": "city", "hq": "city", "founded": "year"}[kind]
    candidates = [v for v in ex.pool[pool_kind] if v != str(current)]
    if prefer_pool and candidates:
        return ex.rng.choice(candidates)
    fresh_kind = {"employer": "org", "hometown": "city", "hq": "city", "founded": "year"}.get(kind, kind)
    return ex.fresh(fresh_kind, remember=False)


def hypothesis(pattern: str, ex: EntitySampler, f: Fact, g: Fact | None) -> str:
    r = ex.rng
    if pattern in ("paraphrase", "neg_premise"):
        return relation(f, r)
    if pattern == "passive":
        pp = r.choice(f.verb.participles)
        return f"{f.patient} was {pp} by {f.agent}."
    if pattern in ("neg_neg", "negation"):
        return relation(f, r, negated=True)
    if pattern == "swap":
        return relation(f, r, agent=f.patient, patient=f.agent, paraphrase=r.random() < 0.5)
    if pattern in ("changed_entity", "overlap_entity"):
        source = g if pattern == "overlap_entity" else None
        replace_agent = r.random() < 0.5
        if source is not None:
            new = r.choice((source.agent, source.patient))
        else:
            new = ex.fresh(f.kind, remember=False)
        if replace_agent:
            return relation(f, r, agent=new)
        return relation(f, r, patient=new)
    if pattern == "changed_event":  # another verb of the same kind, never in the premise
        verbs = PERSON_VERBS if f.kind == "person" else ORG_VERBS
        verb = r.choice([v for v in verbs if v is not f.verb
                         and not set(v.participles) & set(f.verb.participles)])
        other = replace(f, verb=verb, form=r.randrange(len(verb.forms)))
        return relation(other, r, paraphrase=False)
    if pattern in ("subfact_detail", "changed_detail"):
        kind, value = r.choice(fact_details(f))
        if pattern == "changed_detail":
            value = other_value(ex, kind, str(value), prefer_pool=r.random() < 0.25)
        return relation(f, r, detail=(kind, value))
    if pattern in ("subfact_attr", "wrong_attr"):
        subject, attr, value = f.attr
        if pattern == "wrong_attr":
            other = f.patient if subject == f.agent else f.agent
            how = r.random()
            if how < 0.15:  # right value, wrong person (everything in the premise)
                subject = other
            else:
                value = other_value(ex, attr, value, prefer_pool=how < 0.3)
        return claim(subject, attr, value, r)
    if pattern == "other_fact":
        if g.attr and r.random() < 0.3:
            return claim(g.attr[0], g.attr[1], g.attr[2], r)
        return relation(g, r)
    raise ValueError(f"unknown pattern {pattern!r}")


# ----------------------------------------------------------------------------- examples


def make_example(rng: random.Random, pattern: str) -> tuple[str, str, str]:
    """Return (premise, hypothesis, label) for one hypothesis pattern."""
    label = PATTERNS[pattern][0]
    ex = EntitySampler(rng)
    kind = "person" if rng.random() < 0.65 else "org"
    negated = pattern in NEGATED_PREMISE or (pattern in NEEDS_ATTR and rng.random() < 0.1)
    f = ex.fact(kind, with_attr=pattern in NEEDS_ATTR or rng.random() < 0.35, negated=negated)
    g = None
    if pattern in NEEDS_OTHER or rng.random() < 0.12:
        g = ex.fact(kind, with_attr=rng.random() < 0.3)
    sentences = [render_premise_fact(f, rng)]
    if g is not None:
        sentences.append(render_premise_fact(g, rng))
    if rng.random() < (0.12 if g is None else 0.08):
        sentences.append(background_sentence(ex, f))
    if len(sentences) > 1 and rng.random() < 0.3:  # the key fact is not always first
        sentences[0], sentences[1] = sentences[1], sentences[0]
    hyp = hypothesis(pattern, ex, f, g)
    return " ".join(sentences), hyp, label


def generate_split(rng: random.Random, n: int, seen: set[str]) -> list[tuple[str, str, str, str]]:
    """``n`` (premise, hypothesis, label, pattern) rows, none of whose sentences occurred
    before (in any split), so dev and test never copy a train sentence."""
    # Exactly balanced labels (the majority baseline is 50%), then a pattern for each label.
    labels = [LABELS[i % 2] for i in range(n)]
    rng.shuffle(labels)
    by_label = {lab: [p for p in PATTERNS if PATTERNS[p][0] == lab] for lab in LABELS}
    rows: list[tuple[str, str, str, str]] = []
    while len(rows) < n:
        names = by_label[labels[len(rows)]]
        pattern = rng.choices(names, [PATTERNS[p][1] for p in names])[0]
        premise, hyp, label = make_example(rng, pattern)
        if premise in seen or hyp in seen:
            continue
        seen.add(premise)
        seen.add(hyp)
        rows.append((premise, hyp, label, pattern))
    return rows
