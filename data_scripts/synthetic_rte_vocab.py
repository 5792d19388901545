"""The synthetic RTE's vocabulary and hypothesis patterns (data only, no randomness).

Names, roles, places, companies and verbs that premises are built from, how an attribute is
mentioned in a premise (``CLAUSES``) and claimed in a hypothesis (``CLAIMS``), and the
hypothesis ``PATTERNS`` with their labels and shares. Every collection is a tuple or a dict
with a fixed order (never a set that is iterated), so generation stays byte-identical
whatever PYTHONHASHSEED is. ``make_synthetic_rte.py`` documents the data set as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass

LABELS = ("entailment", "not_entailment")

# ----------------------------------------------------------------------------- vocabulary

FIRST_NAMES = (
    "Maria", "Omar", "Anna", "David", "Sofia", "James", "Leila", "Peter", "Yuki", "Carlos",
    "Elena", "Samuel", "Fatima", "Thomas", "Ingrid", "Ahmed", "Laura", "Victor", "Chen",
    "Rosa", "Daniel", "Amara", "Lucas", "Nadia", "George", "Hana", "Marco", "Olivia", "Ravi",
    "Clara", "Hugo", "Zainab", "Felix", "Irene", "Kofi", "Julia", "Pablo", "Mei", "Stefan",
    "Grace", "Ivan", "Aisha", "Martin", "Lucia", "Tariq", "Emma", "Noah", "Priya", "Oscar",
    "Sara", "Henrik", "Ana", "Jonas", "Keiko", "Bruno", "Esther", "Mateo", "Lina", "Paul",
    "Rita",
)
LAST_NAMES = (
    "Costa", "Haddad", "Novak", "Smith", "Rossi", "Tanaka", "Okafor", "Berg", "Garcia",
    "Kowalski", "Dubois", "Jensen", "Silva", "Muller", "Khan", "Ivanova", "Moreau", "Lopez",
    "Nakamura", "Brown", "Fischer", "Mensah", "Petrov", "Larsen", "Romano", "Santos", "Weber",
    "Ali", "Clarke", "Horvat", "Nguyen", "Lindqvist", "Mendes", "Park", "Schmidt", "Wilson",
    "Yilmaz", "Owusu", "Bianchi", "Fernandez", "Hughes", "Kim", "Marsh", "Ortega", "Quinn",
    "Reyes", "Sato", "Torres", "Varga", "Walsh", "Abbas", "Baker", "Dahl", "Evans", "Ferrari",
    "Gupta", "Hale", "Ito", "Keller", "Molina",
)
ROLES = (
    "doctor", "engineer", "lawyer", "teacher", "journalist", "architect", "nurse",
    "accountant", "chef", "pilot", "scientist", "banker", "painter", "farmer", "judge",
    "pharmacist", "economist", "photographer", "professor", "designer", "electrician",
    "diplomat", "surgeon", "editor",
)
CITIES = (
    "Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Dublin", "Krakow", "Accra", "Porto",
    "Seville", "Turin", "Hamburg", "Quito", "Manila", "Tunis", "Bergen", "Leeds", "Lyon",
    "Denver", "Perth", "Toronto", "Madrid", "Vienna", "Prague", "Cairo", "Dakar", "Hanoi",
    "Bogota", "Santiago", "Helsinki", "Athens", "Zagreb", "Riga", "Geneva", "Glasgow",
    "Boston", "Seattle", "Austin", "Chennai", "Jakarta", "Auckland", "Montreal", "Marseille",
    "Antwerp", "Bologna", "Valencia", "Kyoto", "Durban",
)
ORG_HEADS = (
    "Northwind", "Bluepeak", "Silverline", "Redwood", "Brightwater", "Ironbridge", "Sunfield",
    "Clearpath", "Greenhill", "Stonegate", "Westbrook", "Highmark", "Oakridge", "Lakeside",
    "Goldcrest", "Seaview", "Fairport", "Blackstone", "Evergreen", "Summit", "Riverton",
    "Crescent", "Pinecliff", "Harbor",
)
ORG_TAILS = (
    "Systems", "Energy", "Foods", "Logistics", "Pharma", "Media", "Motors", "Bank",
    "Telecom", "Airlines", "Textiles", "Robotics",
)
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)
YEARS = tuple(range(1961, 2024))


@dataclass(frozen=True)
class Verb:
    """A directional action: ``forms`` are (base, past) paraphrases of the same meaning,
    ``participles`` the words used in the passive ("was hired by")."""

    forms: tuple[tuple[str, str], ...]
    participles: tuple[str, ...]


PERSON_VERBS = (
    Verb((("hire", "hired"), ("recruit", "recruited"), ("take on", "took on")), ("hired", "recruited")),
    Verb((("sue", "sued"), ("file a lawsuit against", "filed a lawsuit against"),
          ("take legal action against", "took legal action against")), ("sued",)),
    Verb((("interview", "interviewed"), ("question", "questioned")), ("interviewed", "questioned")),
    Verb((("defeat", "defeated"), ("beat", "beat"), ("win against", "won against")), ("defeated", "beaten")),
    Verb((("criticize", "criticized"), ("publicly attack", "publicly attacked"),
          ("speak out against", "spoke out against")), ("criticized",)),
    Verb((("praise", "praised"), ("commend", "commended"), ("speak highly of", "spoke highly of")),
         ("praised", "commended")),
    Verb((("replace", "replaced"), ("take over from", "took over from")), ("replaced",)),
    Verb((("mentor", "mentored"), ("coach", "coached"), ("train", "trained")), ("mentored", "coached", "trained")),
    Verb((("visit", "visited"), ("call on", "called on")), ("visited",)),
    Verb((("fire", "fired"), ("dismiss", "dismissed"), ("let go of", "let go of")), ("fired", "dismissed")),
)
ORG_VERBS = (
    Verb((("acquire", "acquired"), ("buy", "bought"), ("take over", "took over")),
         ("acquired", "bought", "taken over")),
    Verb((("fund", "funded"), ("finance", "financed"), ("back", "backed")), ("funded", "financed", "backed")),
    Verb((("supply", "supplied"), ("deliver equipment to", "delivered equipment to")), ("supplied",)),
    Verb((("hire", "hired"), ("contract", "contracted"), ("engage", "engaged")), ("hired", "contracted", "engaged")),
)

# Attribute kinds: how the premise mentions one (a clause after the name) and how a hypothesis
# claims it (a short sentence). Every claim template is used with true and with false values.
PERSON_ATTRS = ("role", "employer", "age", "hometown")
ORG_ATTRS = ("hq", "staff", "founded")
CLAUSES = {
    "role": ", {a} {v},",
    "employer": ", who works for {v},",
    "age": ", aged {v},",
    "hometown": ", who was born in {v},",
    "hq": ", which is based in {v},",
    "staff": ", which employs {v} people,",
    "founded": ", founded in {v},",
}
CLAIMS = {
    "role": ("{s} is {a} {v}.", "{s} works as {a} {v}."),
    "employer": ("{s} works for {v}.", "{s} is employed by {v}."),
    "age": ("{s} is {v} years old.",),
    "hometown": ("{s} was born in {v}.", "{s} comes from {v}."),
    "hq": ("{s} is based in {v}.", "{s} has its headquarters in {v}."),
    "staff": ("{s} employs {v} people.", "{s} has {v} employees."),
    "founded": ("{s} was founded in {v}.",),
}

# Hypothesis patterns: name -> (label, weight within its label; each label sums to 50, so a
# weight is also the pattern's share of the data in percent). Most patterns can be solved by
# checking that what the hypothesis says is in the premise (a paraphrase or sub-fact against a
# person / company / event the premise never mentions); the hard ones -- negation of the premise,
# swapped roles, a wrong value or person taken from the premise itself -- are 20% of the data.
PATTERNS = {
    # entailment
    "paraphrase": ("entailment", 16),      # same fact, another verb / word order
    "passive": ("entailment", 12),         # "B was hired by A"
    "subfact_attr": ("entailment", 9),     # restates the extra clause ("A is a nurse")
    "subfact_detail": ("entailment", 7),   # restates the fact with its place / year / amount
    "other_fact": ("entailment", 3),       # restates the second sentence's fact
    "neg_neg": ("entailment", 3),          # negated premise, negated hypothesis (hard)
    # not_entailment
    "changed_entity": ("not_entailment", 15),  # a person / company not in the premise
    "changed_event": ("not_entailment", 13),   # the same people, an event the premise never states
    "negation": ("not_entailment", 5),     # premise positive, hypothesis negated
    "neg_premise": ("not_entailment", 3),  # premise negated, hypothesis positive (hard)
    "swap": ("not_entailment", 4),         # "B hired A" (hard: every word is in the premise)
    "changed_detail": ("not_entailment", 4),   # wrong place / year / amount (hard)
    "overlap_entity": ("not_entailment", 2),   # someone from the other sentence instead (hard)
    "wrong_attr": ("not_entailment", 4),       # the clause with a wrong value or person (hard)
}
HARD_PATTERNS = ("neg_neg", "neg_premise", "swap", "changed_detail", "overlap_entity", "wrong_attr")
NEEDS_ATTR = {"subfact_attr", "wrong_attr"}
NEEDS_OTHER = {"other_fact", "overlap_entity"}
NEGATED_PREMISE = {"neg_neg", "neg_premise"}


def article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


PATTERN_TEXT = {
    "paraphrase": "the premise's fact with another verb of the same meaning (\"hired\" / \"recruited\")",
    "passive": "the fact in the passive voice (\"B was hired by A\")",
    "subfact_attr": "restates the premise's extra clause (\"A is a nurse\")",
    "subfact_detail": "the fact with its correct place, year or amount",
    "other_fact": "restates the fact of the premise's other sentence",
    "neg_neg": "premise negated (\"did not hire\"), hypothesis negated too",
    "changed_entity": "a person or company that is not in the premise",
    "changed_event": "the same two people/companies, but an event the premise does not state",
    "negation": "premise positive, hypothesis negated",
    "neg_premise": "premise negated, hypothesis positive",
    "swap": "agent and patient swapped (\"B hired A\"): every word is in the premise",
    "changed_detail": "a wrong place, year or amount (sometimes one from the premise)",
    "overlap_entity": "a person/company from the premise's other sentence instead",
    "wrong_attr": "the clause with a wrong value, or the right value for the wrong person",
}

