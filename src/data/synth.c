/* synth: procedural curriculum corpus (see synth.h). Generators append text to a growable string; every
 * random choice goes through rnd() (integer multiply-shift on ZyRng output) so the bytes are platform-free. */
#include "data/synth.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------- strings */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} Str;

static int s_reserve(Str *s, size_t extra) {
    if (s->oom) return -1;
    if (s->n + extra + 1 <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 256;
    while (cap < s->n + extra + 1) cap *= 2;
    char *p = realloc(s->p, cap);
    if (!p) {
        s->oom = 1;
        return -1;
    }
    s->p = p;
    s->cap = cap;
    return 0;
}

static void s_putn(Str *s, const char *t, size_t n) {
    if (s_reserve(s, n)) return;
    memcpy(s->p + s->n, t, n);
    s->n += n;
    s->p[s->n] = '\0';
}
static void s_put(Str *s, const char *t) { s_putn(s, t, strlen(t)); }
static void s_putc(Str *s, char c) { s_putn(s, &c, 1); }

__attribute__((format(printf, 2, 3))) static void s_printf(Str *s, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        s_putn(s, small, (size_t)n);
        return;
    }
    if (s_reserve(s, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(s->p + s->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->n += (size_t)n;
}

static void s_clear(Str *s) {
    s->n = 0;
    if (s->p) s->p[0] = '\0';
}
static void s_free(Str *s) {
    free(s->p);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------------------------------------------ random */

static uint32_t rnd(ZyRng *r, uint32_t n) { return (uint32_t)(((zy_rng_next(r) >> 32) * (uint64_t)n) >> 32); }
static int range(ZyRng *r, int lo, int hi) { return lo + (int)rnd(r, (uint32_t)(hi - lo + 1)); }
static int chance(ZyRng *r, int pct) { return (int)rnd(r, 100) < pct; }
#define PICK(r, arr) ((arr)[rnd((r), (uint32_t)ZY_ARRAY_LEN(arr))])

/* ------------------------------------------------------------------------------------------------- words */

typedef struct {
    const char *name;
    int she;
} Person;

static const Person PEOPLE[] = {
    {"Mia", 1},   {"Leo", 0},   {"Ava", 1},   {"Omar", 0},  {"Nina", 1},  {"Theo", 0},   {"Ruth", 1},  {"Ivan", 0},
    {"Lena", 1},  {"Sam", 0},   {"Priya", 1}, {"Jonah", 0}, {"Clara", 1}, {"Felix", 0},  {"Hana", 1},  {"Marco", 0},
    {"Zoe", 1},   {"Eli", 0},   {"Rosa", 1},  {"Kai", 0},   {"Iris", 1},  {"Noah", 0},   {"Maya", 1},  {"Otto", 0},
    {"Ada", 1},   {"Ben", 0},   {"Yuki", 1},  {"Tariq", 0}, {"Elsa", 1},  {"Hugo", 0},   {"Lily", 1},  {"Amir", 0},
    {"Nora", 1},  {"Finn", 0},  {"Sofia", 1}, {"Raj", 0},   {"Greta", 1}, {"Luca", 0},   {"Esme", 1},  {"Dev", 0},
    {"Mara", 1},  {"Paul", 0},  {"June", 1},  {"Ezra", 0},  {"Ines", 1},  {"Tom", 0},    {"Vera", 1},  {"Abel", 0},
    {"Alma", 1},  {"Cyrus", 0}, {"Dina", 1},  {"Emil", 0},  {"Faye", 1},  {"Gus", 0},    {"Hazel", 1}, {"Ian", 0},
    {"Jade", 1},  {"Kofi", 0},  {"Lara", 1},  {"Milo", 0},  {"Olga", 1},  {"Pedro", 0},  {"Tess", 1},  {"Victor", 0},
};
static const char *const SUBJ[2] = {"he", "she"}, *const OBJ[2] = {"him", "her"}, *const POSS[2] = {"his", "her"};

static const char *const PLACES[] = {
    "harbor", "market", "library", "forest", "river bank", "train station", "bakery", "school", "hill",
    "garden", "museum", "lighthouse", "farm", "city square", "mountain path", "beach", "workshop", "castle",
    "meadow", "bridge", "cave", "orchard", "island", "valley", "kitchen", "attic", "park", "pond", "old mill",
    "post office", "village well", "fishing pier", "bookshop", "greenhouse", "stable", "church tower",
    "riverboat", "campsite", "waterfall", "tea house", "bus stop", "playground", "cellar", "barn", "clock tower",
};
static const char *const OBJECTS[] = {
    "kite", "lantern", "map", "book", "basket", "key", "hat", "ball", "box", "letter", "bicycle", "blanket",
    "cup", "drum", "feather", "flute", "jar", "kettle", "ladder", "mirror", "necklace", "notebook", "painting",
    "pencil", "quilt", "ring", "rope", "scarf", "shell", "spoon", "stone", "telescope", "umbrella", "violin",
    "wagon", "whistle", "clock", "coin", "compass", "candle", "bell", "bottle", "brush", "chair", "coat", "crown",
    "glove", "hammer", "helmet", "jacket", "lamp", "net", "pillow", "radio", "sack", "shovel", "sled", "ticket",
    "toy boat", "trumpet", "vase", "wallet", "watch", "envelope", "apron", "backpack", "bowl", "button", "camera",
    "teapot", "puzzle", "ribbon", "saddle", "marble", "map case", "music box", "fishing rod", "paintbrush",
};
static const char *const COLORS[] = {"red", "blue", "green", "yellow", "orange", "purple", "white",
                                     "black", "brown", "gray", "pink", "silver", "golden"};
static const char *const ADJS[] = {
    "small", "large", "old", "new", "shiny", "dusty", "heavy", "light", "tiny", "huge", "strange", "beautiful",
    "broken", "warm", "cold", "soft", "hard", "bright", "dark", "quiet", "loud", "ancient", "wooden", "famous",
    "simple", "fancy", "gentle", "wild", "clever", "busy", "empty", "crowded", "narrow", "wide", "muddy",
    "sunny", "windy", "peaceful", "noisy", "lovely", "curious", "plain", "rusty", "elegant", "humble", "odd",
    "tall", "short", "round", "sharp", "smooth", "rough", "sleepy", "lively", "secret", "hidden", "golden",
};
typedef struct {
    const char *sg, *pl;
} Noun2;
static const Noun2 ANIMALS[] = {
    {"cat", "cats"},       {"dog", "dogs"},         {"fox", "foxes"},         {"owl", "owls"},
    {"rabbit", "rabbits"}, {"horse", "horses"},     {"goat", "goats"},        {"duck", "ducks"},
    {"bear", "bears"},     {"deer", "deer"},        {"mouse", "mice"},        {"frog", "frogs"},
    {"crow", "crows"},     {"sheep", "sheep"},      {"wolf", "wolves"},       {"turtle", "turtles"},
    {"squirrel", "squirrels"}, {"hedgehog", "hedgehogs"}, {"parrot", "parrots"}, {"goose", "geese"},
    {"badger", "badgers"}, {"otter", "otters"},     {"beaver", "beavers"},    {"donkey", "donkeys"},
    {"heron", "herons"},   {"lizard", "lizards"},   {"pig", "pigs"},          {"cow", "cows"},
    {"swan", "swans"},     {"moth", "moths"},       {"bee", "bees"},          {"seal", "seals"},
};
static const char *const APERSON[] = {"young", "old", "tall", "kind", "cheerful", "quiet", "busy", "clever", "tired",
                                      "friendly", "brave", "shy", "gentle", "hungry", "sleepy", "curious", "small"};
static const char *const VT[] = {
    "found", "carried", "painted", "cleaned", "fixed", "lost", "dropped", "opened", "built", "sold", "bought",
    "borrowed", "hid", "wrapped", "polished", "repaired", "noticed", "picked up", "packed", "washed", "measured",
    "drew", "studied", "returned", "shared", "admired", "examined", "collected", "moved", "checked",
};
static const char *const VI[] = {
    "walked", "ran", "laughed", "waited", "smiled", "sang", "danced", "slept", "shouted", "whispered",
    "wandered", "hurried", "rested", "listened", "nodded", "sighed", "worked", "played", "climbed", "swam",
    "jumped", "paused", "cheered", "agreed", "hummed", "stretched",
};
static const char *const VING[] = {"working", "singing", "reading", "fishing", "painting", "sleeping", "waiting",
                                   "cooking", "sweeping", "writing", "knitting", "whistling", "counting", "resting"};
static const char *const ADVS[] = {"slowly", "quickly", "carefully", "quietly", "happily", "suddenly", "gently",
                                   "proudly", "calmly", "softly", "eagerly", "bravely", "patiently", "loudly"};
static const char *const TIMES[] = {
    "In the morning", "At noon", "That evening", "Late at night", "On Monday", "Before sunrise", "After lunch",
    "The next day", "Long ago", "One winter", "Every summer", "On a rainy afternoon", "Just after dawn",
    "On the first day of spring", "Last week", "At the end of the day", "One bright morning", "Years later",
};
static const char *const EMOTIONS[] = {"happy", "sad", "tired", "excited", "nervous", "proud", "curious", "angry",
                                       "calm", "surprised", "worried", "glad", "hungry", "lonely", "hopeful"};
static const char *const FOODS[] = {"bread", "soup", "apples", "cheese", "pie", "rice", "tea", "plums",
                                    "carrots", "honey", "porridge", "pears", "beans", "cake", "noodles", "figs"};
static const char *const JOBS[] = {"baker", "farmer", "teacher", "sailor", "doctor", "painter", "carpenter",
                                   "fisher", "gardener", "tailor", "potter", "miller", "singer", "builder",
                                   "librarian", "shepherd", "clockmaker", "musician", "merchant", "pilot"};
static const char *const NUMWORDS[] = {"two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve"};
static const char *const SEASONS[] = {"spring", "summer", "autumn", "winter"};
static const char *const GREETINGS[] = {"Hello", "Good morning", "Hi", "Good evening", "Welcome back", "Hey"};
static const char *const SPEECH[] = {"said", "asked", "whispered", "shouted", "replied", "called", "added"};
static const char *const WEATHER[] = {
    "It was raining", "The sun was shining", "A cold wind blew", "Snow covered the ground",
    "Fog rolled in from the sea", "The sky was clear", "Thunder rumbled far away", "A warm breeze moved the trees",
};
static const char *const DAYS[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
static const char *const ITEMS[] = {"apples", "marbles", "stickers", "books", "coins", "shells", "pencils",
                                    "cookies", "stamps", "cards", "eggs", "flowers", "buttons", "beads"};
static const char *const ROOMS[] = {"kitchen", "attic", "cellar", "garage", "library", "study", "barn", "shed",
                                    "hallway", "bedroom", "pantry", "workshop", "greenhouse", "porch"};
static const char *const CONTAINERS[] = {"box", "chest", "bag", "drawer", "basket", "crate", "jar", "trunk", "tin"};
static const char *const KV_KEYS[] = {
    "falcon", "ember", "maple", "comet", "willow", "glacier", "orchid", "pebble", "quartz", "raven", "saffron",
    "thistle", "tundra", "velvet", "walnut", "zephyr", "anchor", "cobalt", "dahlia", "eagle", "fjord", "garnet",
    "indigo", "jasper", "kestrel", "lagoon", "nectar", "oasis", "quill", "reef", "summit", "timber", "umber",
    "violet", "wren", "yarrow", "acorn", "beacon", "canyon", "delta", "echo", "fern", "granite", "juniper", "kelp",
    "lotus", "mango", "nova", "onyx", "pine", "quarry", "ripple", "sparrow", "tulip", "whale", "amber", "birch",
    "cedar", "dune", "elm", "flint", "grove", "hollow", "knoll", "lilac", "moss", "nutmeg", "olive", "prairie",
    "robin", "sage", "tide", "upland", "vine", "wheat", "alder", "bison", "coral", "dove", "ermine", "finch",
    "gull", "hawk", "ibis", "jackal", "koala", "lynx", "moose", "newt", "osprey", "puma", "quail", "rook", "stork",
    "tapir", "urchin", "vole", "walrus", "yak", "zebra", "basil", "clover", "daisy", "fennel", "ginger", "heather",
    "ivy", "laurel", "mint", "nettle", "oak", "poppy", "rose", "sorrel", "tansy", "aspen", "cloud", "frost", "gale",
    "haze", "mist", "storm", "aurora", "blaze", "cinder", "flare", "spark", "torch", "copper", "iron",
};

/* ------------------------------------------------------------------------------------------- generator */

typedef struct {
    ZyRng rng;
    const SynthHeldout *ho;
    uint8_t kv_eval[ZY_ARRAY_LEN(KV_KEYS)]; /* keys reserved for eval/kv_recall */
    uint64_t *prog_hashes;                 /* sorted hashes of eval/code_exec programs */
    size_t n_prog_hashes;
    Str tmp, tmp2;                         /* scratch */
} Gen;

typedef struct {
    const Person *hero, *friend;
    const char *obj, *color, *place, *season;
    const Noun2 *animal;
} Story;

static int held(const Gen *g, long a, long b) { return synth_is_heldout(g->ho, a, b); }

static void story_init(Gen *g, Story *st) {
    ZyRng *r = &g->rng;
    st->hero = &PEOPLE[rnd(r, ZY_ARRAY_LEN(PEOPLE))];
    do st->friend = &PEOPLE[rnd(r, ZY_ARRAY_LEN(PEOPLE))];
    while (st->friend == st->hero);
    st->obj = PICK(r, OBJECTS);
    st->color = PICK(r, COLORS);
    st->place = PICK(r, PLACES);
    st->season = PICK(r, SEASONS);
    st->animal = &PICK(r, ANIMALS);
}

/* Expands one tag of a template. Story tags stay fixed within a story; the others draw fresh words. */
static void expand_tag(Gen *g, const Story *st, const char *tag, size_t len, Str *o) {
    ZyRng *r = &g->rng;
#define IS(t) (len == sizeof(t) - 1 && memcmp(tag, t, len) == 0)
    if (IS("N")) s_put(o, st->hero->name);
    else if (IS("P")) s_put(o, SUBJ[st->hero->she]);
    else if (IS("PO")) s_put(o, OBJ[st->hero->she]);
    else if (IS("PP")) s_put(o, POSS[st->hero->she]);
    else if (IS("M")) s_put(o, st->friend->name);
    else if (IS("MP")) s_put(o, SUBJ[st->friend->she]);
    else if (IS("MPO")) s_put(o, OBJ[st->friend->she]);
    else if (IS("MPP")) s_put(o, POSS[st->friend->she]);
    else if (IS("O")) s_put(o, st->obj);
    else if (IS("C")) s_put(o, st->color);
    else if (IS("L")) s_put(o, st->place);
    else if (IS("SE")) s_put(o, st->season);
    else if (IS("L2")) s_put(o, PICK(r, PLACES));
    else if (IS("O2")) s_put(o, PICK(r, OBJECTS));
    else if (IS("C2")) s_put(o, PICK(r, COLORS));
    else if (IS("A")) s_put(o, PICK(r, ADJS));
    else if (IS("AP")) s_put(o, PICK(r, APERSON));
    else if (IS("AN")) s_put(o, PICK(r, ANIMALS).sg);
    else if (IS("ANS")) s_put(o, PICK(r, ANIMALS).pl);
    else if (IS("Z")) s_put(o, st->animal->sg);
    else if (IS("ZS")) s_put(o, st->animal->pl);
    else if (IS("VT")) s_put(o, PICK(r, VT));
    else if (IS("VI")) s_put(o, PICK(r, VI));
    else if (IS("VING")) s_put(o, PICK(r, VING));
    else if (IS("ADV")) s_put(o, PICK(r, ADVS));
    else if (IS("T")) s_put(o, PICK(r, TIMES));
    else if (IS("E")) s_put(o, PICK(r, EMOTIONS));
    else if (IS("F")) s_put(o, PICK(r, FOODS));
    else if (IS("J")) s_put(o, PICK(r, JOBS));
    else if (IS("NW")) s_put(o, PICK(r, NUMWORDS));
    else if (IS("G")) s_put(o, PICK(r, GREETINGS));
    else if (IS("S")) s_put(o, PICK(r, SPEECH));
    else if (IS("W")) s_put(o, PICK(r, WEATHER));
    else if (IS("DAY")) s_put(o, PICK(r, DAYS));
    else if (IS("X")) s_put(o, PICK(r, PEOPLE).name);
    else s_putn(o, tag, len); /* unknown tags are a template bug; keep them visible */
#undef IS
}

static int is_vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

/* Expands a template into o: "a" before a vowel becomes "an", the first letter is capitalised. */
static void expand(Gen *g, const Story *st, const char *tpl, Str *o) {
    Str *t = &g->tmp2;
    s_clear(t);
    for (const char *p = tpl; *p;) {
        if (*p == '{') {
            const char *e = strchr(p, '}');
            if (e) {
                expand_tag(g, st, p + 1, (size_t)(e - p - 1), t);
                p = e + 1;
                continue;
            }
        }
        s_putc(t, *p++);
    }
    if (t->oom || !t->p) {
        o->oom = 1;
        return;
    }
    size_t start = o->n;
    for (size_t i = 0; i < t->n; i++) {
        char c = t->p[i];
        s_putc(o, c);
        int word_a = (c == 'a' || c == 'A') && (i == 0 || t->p[i - 1] == ' ' || t->p[i - 1] == '"') &&
                     i + 2 < t->n && t->p[i + 1] == ' ' && is_vowel(t->p[i + 2]);
        if (word_a) s_putc(o, 'n');
    }
    if (o->oom) return;
    for (size_t i = start; i < o->n; i++) {
        if (o->p[i] == '"') continue;
        if (o->p[i] >= 'a' && o->p[i] <= 'z') o->p[i] = (char)(o->p[i] - 'a' + 'A');
        break;
    }
}

static void sentence(Gen *g, const Story *st, const char *tpl, Str *o) {
    if (o->n > 0 && o->p[o->n - 1] != '\n') s_putc(o, ' ');
    expand(g, st, tpl, o);
}

/* ---- prose templates ---- */

static const char *const T_OPEN[] = {
    "{T}, {N} {VI} to the {L}.",
    "Once there was a {J} named {N} who lived near the {L}.",
    "{N} was a {AP} {J} who loved the {L}.",
    "Long ago, in a {A} village near the {L}, there lived a {J} called {N}.",
    "{T}, {N} woke up feeling {E}.",
    "Nobody in town knew the {L} better than {N}.",
    "{N} had always wanted to visit the {L}.",
    "It was {SE}, and {N} was on {PP} way to the {L}.",
    "{W}, and {N} decided to go to the {L}.",
    "Every day, {N} the {J} walked past the {L}.",
    "This is the story of {N} and the {L}.",
    "{N} and {M} met for the first time at the {L}.",
};
static const char *const T_HAVE[] = {
    "{N} had a {C} {O}.",
    "{N} carried a {C} {O} everywhere.",
    "In {PP} bag, {N} kept a {C} {O}.",
    "{N} owned a {C} {O} that {PP} grandmother had given {PO}.",
    "{N} had found a {C} {O} near the {L2}.",
    "The {O} that {N} loved most was {C}.",
};
static const char *const T_EVENT[] = {
    "{P} {VI} {ADV} along the path.",
    "On the way, {P} met a {AP} {AN}.",
    "The {AN} looked at {PO} and {VI}.",
    "{N} {VT} the {O} {ADV}.",
    "Suddenly, {P} heard a {A} sound from the {L2}.",
    "{P} stopped to eat some {F}.",
    "Near the {L2}, a {J} was {VING} {ADV}.",
    "There were {NW} {ANS} sitting by the {L2}.",
    "{N} and {M} {VI} together until the sun went down.",
    "{P} thought about the {L2} and felt {E}.",
    "Because {P} was {E}, {P} {VI} {ADV}.",
    "{M}, who was a {J}, {VT} a {A} {O2}.",
    "The {L} was {A} and {A}.",
    "After a while, {N} {VT} the {O2}.",
    "When {P} reached the {L2}, {P} saw {M}.",
    "{P} could not find {PP} {O2}, so {P} {VI} {ADV}.",
    "{N} gave {M} some {F}, and {MP} {VI}.",
    "The {AN} {VI} while {N} {VT} the {O2}.",
    "Neither {N} nor {M} knew where the {L2} was.",
    "{N} asked {M} to help {PO} with the {O2}.",
    "{N} was {E}, so {P} {VI}.",
    "{M} {VT} {MPP} {O2} and {VI}.",
    "For a long time, nobody {VI}.",
    "A {AP} {J} from the {L2} came by with a {O2}.",
    "{P} counted {NW} {ANS} on the way home.",
    "The road was {A}, but {N} did not mind.",
    "{W}.",
    "Then {N} remembered the {A} {O2} at the {L2}.",
    "{M} told {PO} a story about a {AP} {AN}.",
    "At the {L2}, {N} bought some {F} for {M}.",
    "It was a {A} day, even for {SE}.",
    "{N} wondered if the {AN} would come back.",
};
static const char *const T_DIALOGUE[] = {
    "\"{G}, {M}!\" said {N}.",
    "\"Have you seen my {O}?\" {N} asked.",
    "\"It is {C},\" {N} explained, \"and very {A}.\"",
    "{M} {S}, \"I saw a {A} {AN} near the {L2}.\"",
    "\"Let us go to the {L2},\" {MP} said.",
    "\"Why are you so {E}?\" asked {M}.",
    "\"Because I {VT} my {O2},\" {N} answered.",
    "\"Thank you,\" said {N}. \"You are very kind.\"",
    "\"Wait for me!\" {N} shouted.",
    "\"Do you like {F}?\" {M} asked. \"Yes,\" {N} said, \"very much.\"",
    "\"Where is the {L2}?\" asked {N}. \"Not far,\" said {M}.",
    "\"I am {E} today,\" {M} admitted.",
    "\"Look at that {AN}!\" {N} shouted.",
};
static const char *const T_RECALL[] = {
    "The {O} was {C}.",
    "{N} looked at the {C} {O} and smiled.",
    "{P} still had the {C} {O}.",
    "The {C} {O} was safe in {PP} bag.",
    "{M} admired the {C} {O}.",
};
static const char *const T_END[] = {
    "In the end, {N} felt {E}.",
    "That night, {N} {VI} {ADV}.",
    "{N} never forgot that day at the {L}.",
    "The next morning, {P} went back to the {L} with {M}.",
    "And so the {C} {O} stayed with {N} for many years.",
    "It had been a {A} day, and {N} was {E}.",
    "When {P} got home, {P} put the {O} on the shelf.",
};
static const char *const T_PLACE[] = {
    "The {L} is a {A} place.",
    "In {SE}, the {L} is {A} and {A}.",
    "Many {ANS} live near the {L}.",
    "People come to the {L} to buy {F}.",
    "There is a {A} {O2} beside the {L}.",
    "The {L} opens early in the morning.",
    "At night, the {L} is {A}.",
    "A {J} named {N} looks after the {L}.",
    "Visitors say that the {L} smells of {F}.",
    "The road to the {L} is long and {A}.",
    "Children like to play near the {L}.",
    "On {DAY}, the {L} is always {A}.",
    "From the {L}, you can see the {L2}.",
};
static const char *const T_ANIMAL[] = {
    "The {Z} is a {A} animal.",
    "Most {ZS} are {A} and {A}.",
    "A young {Z} likes to eat {F}.",
    "You can often see {ZS} near the {L2}.",
    "In {SE}, {ZS} grow {A} coats.",
    "When a {Z} is {E}, it {VI}.",
    "Some people keep a {Z} at the {L2}.",
    "A {Z} can hear a {A} sound from far away.",
    "{ZS} and {ANS} do not always get along.",
    "A {J} once said that the {Z} is the most {A} animal of all.",
};
static const char *const T_DIARY[] = {
    "Today I {VT} a {A} {O2}.",
    "I went to the {L2} with {X}.",
    "I felt {E} all afternoon.",
    "For dinner we had {F} and {F}.",
    "Tomorrow I want to visit the {L2}.",
    "I saw {NW} {ANS} on the way to the {L2}.",
    "{X} says I should be more {A}.",
    "My {O2} is still {A}, but I like it.",
};
static const char *const T_NEWS[] = {
    "A {J} from the {L} {VT} a {A} {O2} on {DAY}.",
    "Witnesses said the {O2} was {C2} and very {A}.",
    "The mayor {VI} when {MP} heard the news.",
    "Officials at the {L2} say {NW} {ANS} were seen nearby.",
    "Local {J}s expect a {A} {SE}.",
    "The {L2} will be closed until {DAY}.",
    "{N}, a {J}, told reporters that {P} was {E}.",
};
static const char *const T_STEPS[] = {
    "Take the {O2} and clean it {ADV}.",
    "Put the {F} in a {A} bowl.",
    "Wait until the {O2} is {A}.",
    "Ask {X} to hold the {O2}.",
    "Carry everything to the {L2}.",
    "Wrap the {O2} in a {C2} cloth.",
    "Check that the {O2} is not {A}.",
};

static void gen_story(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    Story st;
    story_init(g, &st);
    sentence(g, &st, PICK(r, T_OPEN), o);
    int have_at = range(r, 0, 2), paras = range(r, 1, 3), said_have = 0;
    for (int p = 0; p < paras; p++) {
        if (p > 0) s_put(o, "\n\n");
        int n = range(r, 3, 7);
        for (int i = 0; i < n; i++) {
            if (!said_have && p * 8 + i >= have_at) {
                sentence(g, &st, PICK(r, T_HAVE), o);
                said_have = 1;
                continue;
            }
            int k = (int)rnd(r, 100);
            if (k < 25)
                sentence(g, &st, PICK(r, T_DIALOGUE), o);
            else if (k < 35 && said_have)
                sentence(g, &st, PICK(r, T_RECALL), o);
            else
                sentence(g, &st, PICK(r, T_EVENT), o);
        }
    }
    if (!said_have) sentence(g, &st, PICK(r, T_HAVE), o);
    sentence(g, &st, PICK(r, T_END), o);
}

static void gen_lines(Gen *g, const Story *st, const char *const *tpl, size_t n_tpl, int lo, int hi, Str *o) {
    int n = range(&g->rng, lo, hi);
    for (int i = 0; i < n; i++) sentence(g, st, tpl[rnd(&g->rng, (uint32_t)n_tpl)], o);
}

static void gen_general_doc(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    Story st;
    story_init(g, &st);
    int k = (int)rnd(r, 100);
    if (k < 50) {
        gen_story(g, o);
    } else if (k < 60) {
        s_printf(o, "About the %s\n\n", st.place);
        gen_lines(g, &st, T_PLACE, ZY_ARRAY_LEN(T_PLACE), 4, 9, o);
    } else if (k < 68) {
        s_printf(o, "Facts about the %s.", st.animal->sg);
        gen_lines(g, &st, T_ANIMAL, ZY_ARRAY_LEN(T_ANIMAL), 4, 8, o);
    } else if (k < 76) {
        s_printf(o, "Dear %s,\n\n", st.friend->name);
        sentence(g, &st, "I hope you are {E} and well.", o);
        gen_lines(g, &st, T_EVENT, ZY_ARRAY_LEN(T_EVENT), 2, 5, o);
        sentence(g, &st, "Please write back soon and tell me about the {L2}.", o);
        static const char *const closings[] = {"With love", "Your friend", "Best wishes", "Yours"};
        s_printf(o, "\n\n%s,\n%s", PICK(r, closings), st.hero->name);
    } else if (k < 84) {
        s_printf(o, "%s.", PICK(r, DAYS));
        gen_lines(g, &st, T_DIARY, ZY_ARRAY_LEN(T_DIARY), 3, 7, o);
    } else if (k < 92) {
        gen_lines(g, &st, T_NEWS, ZY_ARRAY_LEN(T_NEWS), 3, 6, o);
    } else if (k < 96) {
        s_printf(o, "How to care for a %s %s:", PICK(r, ADJS), st.obj);
        int n = range(r, 3, 6);
        for (int i = 0; i < n; i++) {
            s_printf(o, "\n%d. ", i + 1);
            expand(g, &st, PICK(r, T_STEPS), o);
        }
    } else {
        int n = range(r, 4, 9);
        for (int i = 0; i < n; i++) {
            if (i) s_putc(o, '\n');
            s_printf(o, "%s: ", (i % 2 ? st.friend : st.hero)->name);
            static const char *const lines[] = {"{G}!", "Did you see the {A} {AN}?", "I left my {O2} at the {L2}.",
                                                "We should go to the {L2}.", "I am {E}.", "Let us eat some {F}.",
                                                "Is it {A} today?", "No, I think it is {A}.", "Where is the {O}?"};
            expand(g, &st, PICK(r, lines), o);
        }
    }
}

/* ------------------------------------------------------------------------------------------------- math */

/* Fresh 2-digit addends, never a held-out pair. */
static void pair2(Gen *g, int *a, int *b) {
    do {
        *a = range(&g->rng, 10, 99);
        *b = range(&g->rng, 10, 99);
    } while (held(g, *a, *b));
}

/* Operands for one addition line: mostly 2-digit + 2-digit (the eval format), some with 1 or 3 digits. */
static void addends(Gen *g, int *a, int *b) {
    int k = (int)rnd(&g->rng, 100);
    if (k < 85) {
        pair2(g, a, b);
    } else if (k < 93) {
        *a = range(&g->rng, 0, 9);
        *b = range(&g->rng, 10, 99);
        if (chance(&g->rng, 50)) {
            int t = *a;
            *a = *b;
            *b = t;
        }
    } else {
        *a = range(&g->rng, 100, 999);
        *b = range(&g->rng, 10, 999);
    }
}

/* a - b = c with c >= 0 whose inverse c + b = a is not held out. */
static void subtraction(Gen *g, int lo, int hi, int *a, int *b) {
    do {
        *a = range(&g->rng, lo, hi);
        *b = range(&g->rng, lo / 2, *a);
    } while (held(g, *a - *b, *b));
}

static void gen_drill(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    int k = (int)rnd(r, 100), n = range(r, 10, 30), spaced = chance(r, 15);
    const char *op = k < 75 ? "+" : k < 90 ? "-" : "*";
    if (chance(r, 30))
        s_put(o, *op == '+' ? "Addition practice:\n" : *op == '-' ? "Subtraction practice:\n" : "Times table:\n");
    for (int i = 0; i < n; i++) {
        int a, b, c;
        if (*op == '+') {
            addends(g, &a, &b);
            c = a + b;
        } else if (*op == '-') {
            subtraction(g, 10, chance(r, 80) ? 99 : 999, &a, &b);
            c = a - b;
        } else {
            a = range(r, 2, 12);
            b = range(r, 2, chance(r, 70) ? 12 : 99);
            c = a * b;
        }
        if (i) s_putc(o, '\n');
        s_printf(o, spaced ? "%d %s %d = %d" : "%d%s%d=%d", a, op, b, c);
    }
}

static void gen_qa(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    int n = range(r, 4, 10);
    for (int i = 0; i < n; i++) {
        if (i) s_putc(o, '\n');
        int a, b, k = (int)rnd(r, 100);
        if (k < 55) {
            addends(g, &a, &b);
            int c = a + b;
            switch (rnd(r, 8)) {
            case 0: s_printf(o, "What is %d plus %d? %d", a, b, c); break;
            case 1: s_printf(o, "Q: What is %d + %d?\nA: %d", a, b, c); break;
            case 2: s_printf(o, "%d + %d = %d", a, b, c); break;
            case 3: s_printf(o, "The sum of %d and %d is %d.", a, b, c); break;
            case 4: s_printf(o, "Add %d and %d. The result is %d.", a, b, c); break;
            case 5: s_printf(o, "%d plus %d equals %d.", a, b, c); break;
            case 6: s_printf(o, "Compute %d+%d. Answer: %d", a, b, c); break;
            default: s_printf(o, "%d+%d=%d", a, b, c); break;
            }
        } else if (k < 75) {
            subtraction(g, 10, chance(r, 80) ? 99 : 999, &a, &b);
            int c = a - b;
            switch (rnd(r, 5)) {
            case 0: s_printf(o, "What is %d minus %d? %d", a, b, c); break;
            case 1: s_printf(o, "%d - %d = %d", a, b, c); break;
            case 2: s_printf(o, "Subtract %d from %d: %d", b, a, c); break;
            case 3: s_printf(o, "The difference between %d and %d is %d.", a, b, c); break;
            default: s_printf(o, "%d-%d=%d", a, b, c); break;
            }
        } else if (k < 88) {
            a = range(r, 2, 12);
            b = range(r, 2, chance(r, 70) ? 12 : 40);
            int c = a * b;
            switch (rnd(r, 5)) {
            case 0: s_printf(o, "What is %d times %d? %d", a, b, c); break;
            case 1: s_printf(o, "%d * %d = %d", a, b, c); break;
            case 2: s_printf(o, "The product of %d and %d is %d.", a, b, c); break;
            case 3: s_printf(o, "%d x %d = %d", a, b, c); break;
            default: s_printf(o, "%d*%d=%d", a, b, c); break;
            }
        } else if (k < 92) {
            b = range(r, 2, 12);
            int q = range(r, 2, 12);
            s_printf(o, chance(r, 50) ? "What is %d divided by %d? %d" : "%d / %d = %d", b * q, b, q);
        } else if (k < 95) {
            a = range(r, 10, 999);
            do b = range(r, 10, 999);
            while (b == a);
            s_printf(o, "Which is larger, %d or %d? %d", a, b, a > b ? a : b);
        } else if (k < 97) {
            a = range(r, 10, 998);
            s_printf(o, chance(r, 50) ? "What comes after %d? %d" : "The number after %d is %d.", a, a + 1);
        } else {
            a = range(r, 11, 989);
            s_printf(o, "Round %d to the nearest ten: %d", a, (a + 5) / 10 * 10);
        }
    }
}

static void gen_multidigit(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    int n = range(r, 5, 14);
    for (int i = 0; i < n; i++) {
        if (i) s_putc(o, '\n');
        int digits = range(r, 3, 4), lo = digits == 3 ? 100 : 1000, hi = digits == 3 ? 999 : 9999;
        int a = range(r, lo, hi), b = range(r, 100, hi);
        if (chance(r, 65))
            s_printf(o, chance(r, 70) ? "%d+%d=%d" : "%d + %d = %d", a, b, a + b);
        else if (a >= b)
            s_printf(o, chance(r, 70) ? "%d-%d=%d" : "%d - %d = %d", a, b, a - b);
        else
            s_printf(o, chance(r, 70) ? "%d-%d=%d" : "%d - %d = %d", b, a, b - a);
    }
}

/* Multi-step word problems with the working shown. Every + or - step avoids held-out pairs. */
static void gen_word_problem(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    const Person *p = &PICK(r, PEOPLE), *q;
    do q = &PICK(r, PEOPLE);
    while (q == p);
    const char *it = PICK(r, ITEMS), *P = SUBJ[p->she];
    char Pc[8];
    snprintf(Pc, sizeof Pc, "%s", P);
    Pc[0] = (char)(Pc[0] - 'a' + 'A');
    int kind = (int)rnd(r, 6), a, b, c, d;
    switch (kind) {
    case 0:
        pair2(g, &a, &b);
        s_printf(o, "%s has %d %s. %s gets %d more. How many %s does %s have now?\n%d + %d = %d. The answer is %d.",
                 p->name, a, it, Pc, b, it, p->name, a, b, a + b, a + b);
        break;
    case 1:
        subtraction(g, 20, 99, &a, &b);
        s_printf(o, "%s had %d %s and gave %d to %s. How many %s are left?\n%d - %d = %d. The answer is %d.", p->name, a,
                 it, b, q->name, it, a, b, a - b, a - b);
        break;
    case 2:
        do {
            pair2(g, &a, &b);
            c = range(r, 1, a + b - 1);
        } while (held(g, a + b - c, c));
        d = a + b - c;
        s_printf(o, "%s has %d %s. %s finds %d more, then gives %d to %s. How many %s does %s have?\n"
                    "%d + %d = %d. %d - %d = %d. The answer is %d.",
                 p->name, a, it, Pc, b, c, q->name, it, p->name, a, b, a + b, a + b, c, d, d);
        break;
    case 3:
        a = range(r, 2, 12);
        b = range(r, 2, 9);
        s_printf(o, "A box holds %d %s. How many %s are in %d boxes?\n%d * %d = %d. The answer is %d.", a, it, it, b, a,
                 b, a * b, a * b);
        break;
    case 4:
        pair2(g, &a, &b);
        s_printf(o, "%s reads %d pages on %s and %d pages on %s. How many pages did %s read in total?\n"
                    "%d + %d = %d. The answer is %d.",
                 p->name, a, DAYS[rnd(r, 3)], b, DAYS[3 + rnd(r, 3)], P, a, b, a + b, a + b);
        break;
    default:
        do {
            a = range(r, 2, 9);
            b = range(r, 2, 9);
            c = range(r, 10, 60);
        } while (held(g, a * b, c));
        s_printf(o, "%s buys %d bags with %d %s each, and %s gives %s %d more. How many %s does %s have?\n"
                    "%d * %d = %d. %d + %d = %d. The answer is %d.",
                 p->name, a, b, it, q->name, OBJ[p->she], c, it, p->name, a, b, a * b, a * b, c, a * b + c,
                 a * b + c);
        break;
    }
}

/* ---- programs ---- */

static const char *const VARS[] = {"x", "y", "z", "a", "b", "c", "n", "m", "k", "total", "count", "price", "score", "size"};

/* Applies op to v with a constant, never stating a held-out addition; returns the new value via *out. */
static void program_step(Gen *g, int v, char *op, int *k, int *out) {
    ZyRng *r = &g->rng;
    for (;;) {
        int choice = (int)rnd(r, 10);
        if (choice < 5) {
            *op = '+';
            *k = range(r, 1, 60);
            if (held(g, v, *k)) continue;
            *out = v + *k;
        } else if (choice < 8 && v >= 2) {
            *op = '-';
            *k = range(r, 1, v);
            if (held(g, v - *k, *k)) continue;
            *out = v - *k;
        } else if (v <= 200) {
            *op = '*';
            *k = range(r, 2, 4);
            *out = v * *k;
        } else {
            continue;
        }
        return;
    }
}

/* Writes a program to o and its printed output to ans. */
static void gen_program(Gen *g, Str *o, Str *ans) {
    ZyRng *r = &g->rng;
    int kind = (int)rnd(r, 7);
    const char *v1 = PICK(r, VARS), *v2, *v3;
    do v2 = PICK(r, VARS);
    while (v2 == v1);
    do v3 = PICK(r, VARS);
    while (v3 == v1 || v3 == v2);
    switch (kind) {
    case 0:
    case 1: { /* straight line; kind 1 on one line */
        const char *sep = kind ? "; " : "\n";
        const char *names[3] = {v1, v2, v3};
        int steps = range(r, 1, 2), v = range(r, 1, 60);
        s_printf(o, "%s = %d", v1, v);
        for (int i = 1; i <= steps; i++) {
            char op;
            int k, nv;
            program_step(g, v, &op, &k, &nv);
            s_printf(o, "%s%s = %s %c %d", sep, names[i], names[i - 1], op, k);
            v = nv;
        }
        s_printf(o, "%sprint(%s)", sep, names[steps]);
        s_printf(ans, "%d", v);
        break;
    }
    case 2: { /* loop */
        int init = range(r, 0, 20), n = range(r, 2, 6), add = range(r, 1, 15), v = init;
        int use_i = chance(r, 40);
        for (int i = 0; i < n; i++) v += use_i ? i : add;
        s_printf(o, "%s = %d\nfor i in range(%d):\n    %s = %s + ", v1, init, n, v1, v1);
        if (use_i)
            s_put(o, "i");
        else
            s_printf(o, "%d", add);
        s_printf(o, "\nprint(%s)", v1);
        s_printf(ans, "%d", v);
        break;
    }
    case 3: { /* branch */
        int x = range(r, 1, 99), t = range(r, 10, 90), d, y;
        for (;;) {
            d = range(r, 1, 30);
            if (x > t ? (x - d >= 0 && !held(g, x - d, d)) : !held(g, x, d)) break;
        }
        y = x > t ? x - d : x + d;
        s_printf(o, "%s = %d\nif %s > %d:\n    %s = %s - %d\nelse:\n    %s = %s + %d\nprint(%s)", v1, x, v1, t, v2, v1,
                 d, v2, v1, d, v2);
        s_printf(ans, "%d", y);
        break;
    }
    case 4: { /* function */
        int k = range(r, 2, 5), c = range(r, 0, 9), x = range(r, 1, 20);
        s_printf(o, "def f(%s):\n    return %s * %d + %d\nprint(f(%d))", v1, v1, k, c, x);
        s_printf(ans, "%d", x * k + c);
        break;
    }
    case 5: { /* list */
        int n = range(r, 2, 5), xs[5], sum = 0, mx = 0;
        s_printf(o, "%s = [", v1);
        for (int i = 0; i < n; i++) {
            xs[i] = range(r, 1, 30);
            sum += xs[i];
            if (xs[i] > mx) mx = xs[i];
            s_printf(o, i ? ", %d" : "%d", xs[i]);
        }
        int f = (int)rnd(r, 3);
        s_printf(o, "]\nprint(%s(%s))", f == 0 ? "sum" : f == 1 ? "len" : "max", v1);
        s_printf(ans, "%d", f == 0 ? sum : f == 1 ? n : mx);
        break;
    }
    default: { /* while loop: halvings */
        int n = range(r, 2, 200), steps = 0, v = n;
        while (v > 1) {
            v /= 2;
            steps++;
        }
        s_printf(o, "%s = %d\n%s = 0\nwhile %s > 1:\n    %s = %s // 2\n    %s = %s + 1\nprint(%s)", v1, n, v2, v1, v1,
                 v1, v2, v2, v2);
        s_printf(ans, "%d", steps);
        break;
    }
    }
}

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int is_eval_program(const Gen *g, uint64_t h) {
    size_t lo = 0, hi = g->n_prog_hashes;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g->prog_hashes[mid] < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < g->n_prog_hashes && g->prog_hashes[lo] == h;
}

static void gen_code_doc(Gen *g, Str *o) {
    int n = range(&g->rng, 1, 4);
    Str *prog = &g->tmp, ans = {0};
    for (int i = 0; i < n; i++) {
        do {
            s_clear(prog);
            s_clear(&ans);
            gen_program(g, prog, &ans);
        } while (!prog->oom && is_eval_program(g, fnv1a(prog->p, prog->n)));
        if (i) s_put(o, "\n\n");
        s_put(o, prog->p ? prog->p : "");
        s_printf(o, "\noutput: %s", ans.p ? ans.p : "");
        if (prog->oom || ans.oom) o->oom = 1;
    }
    s_free(&ans);
}

static void gen_mathcode_doc(Gen *g, Str *o) {
    int k = (int)rnd(&g->rng, 100);
    if (k < 45)
        gen_drill(g, o);
    else if (k < 60)
        gen_qa(g, o);
    else if (k < 72)
        gen_word_problem(g, o);
    else if (k < 92)
        gen_code_doc(g, o);
    else
        gen_multidigit(g, o);
}

/* -------------------------------------------------------------------------------------------- long ctx */

/* Filler lengths in bytes: "long" at toy scale, sized for models trained on a few hundred tokens of context (the
 * eval prompts, ~150-330 tokens with a 1k-token vocabulary, fit a 256-token phase-3 window). */
#define LONG_MIN 500
#define LONG_MAX 3000
#define EVAL_LONG_MIN 400
#define EVAL_LONG_MAX 900

static const char *const T_FILLER_EXTRA[] = {
    "The {L2} was {A} that {SE}.", "{X} {VT} a {A} {O2} near the {L2}.", "Nobody could explain the {AP} {AN}.",
    "{W}.", "A {J} {VI} {ADV} by the {L2}.", "The {O2} on the table was {A}.",
};

static void filler_sentence(Gen *g, const Story *st, Str *o) {
    int k = (int)rnd(&g->rng, 100);
    if (k < 55)
        sentence(g, st, PICK(&g->rng, T_EVENT), o);
    else if (k < 70)
        sentence(g, st, PICK(&g->rng, T_PLACE), o);
    else if (k < 80)
        sentence(g, st, PICK(&g->rng, T_DIALOGUE), o);
    else
        sentence(g, st, PICK(&g->rng, T_FILLER_EXTRA), o);
}

/* Emits filler until roughly `until` bytes, placing the n facts at random points; facts[i] is text. */
static void weave(Gen *g, const Story *st, Str *o, size_t target, char (*facts)[160], int n) {
    size_t start = o->n;
    int placed = 0;
    while (placed < n || o->n - start < target) {
        size_t done = o->n - start;
        /* place the next fact once the text has passed its share of the target, with jitter */
        size_t due = target * (size_t)(placed + 1) / (size_t)(n + 1);
        if (placed < n && (done >= due || chance(&g->rng, 4))) {
            if (o->n > 0 && o->p[o->n - 1] != '\n') s_putc(o, ' ');
            s_put(o, facts[placed++]);
            continue;
        }
        if (chance(&g->rng, 6) && o->n > 0) s_put(o, "\n\n");
        filler_sentence(g, st, o);
        if (o->oom) return;
    }
}

static int pick_key(Gen *g, int eval, const int *used, int n_used) {
    for (;;) {
        int k = (int)rnd(&g->rng, ZY_ARRAY_LEN(KV_KEYS));
        if (g->kv_eval[k] != eval) continue;
        int dup = 0;
        for (int i = 0; i < n_used; i++) dup |= used[i] == k;
        if (!dup) return k;
    }
}

/* Key-value recall document; eval: held-out keys, a single question, the answer goes to ans. */
static void gen_kv(Gen *g, Str *o, int eval, Str *ans) {
    ZyRng *r = &g->rng;
    Story st;
    story_init(g, &st);
    int n = eval ? range(r, 3, 6) : range(r, 3, 9), keys[9], vals[9];
    char facts[9][160];
    for (int i = 0; i < n; i++) {
        keys[i] = pick_key(g, eval, keys, i);
        vals[i] = range(r, 1000, 9999);
        const char *k = KV_KEYS[keys[i]];
        switch (rnd(r, 4)) {
        case 0: snprintf(facts[i], sizeof facts[i], "The code for %s is %d.", k, vals[i]); break;
        case 1: snprintf(facts[i], sizeof facts[i], "Remember this: the code for %s is %d.", k, vals[i]); break;
        case 2: snprintf(facts[i], sizeof facts[i], "Someone wrote on the wall that the code for %s is %d.", k, vals[i]); break;
        default: snprintf(facts[i], sizeof facts[i], "The code for %s is %d, and it must not be forgotten.", k, vals[i]); break;
        }
    }
    weave(g, &st, o, (size_t)(eval ? range(r, EVAL_LONG_MIN, EVAL_LONG_MAX) : range(r, LONG_MIN, LONG_MAX)), facts, n);
    s_put(o, "\n\n");
    if (eval) {
        int q = (int)rnd(r, (uint32_t)n);
        s_printf(o, "Q: What is the code for %s? A:", KV_KEYS[keys[q]]);
        s_printf(ans, "%d", vals[q]);
        return;
    }
    int nq = range(r, 1, 3);
    for (int i = 0; i < nq; i++) {
        int q = (int)rnd(r, (uint32_t)n);
        if (i) s_putc(o, '\n');
        s_printf(o, "Q: What is the code for %s? A: %d", KV_KEYS[keys[q]], vals[q]);
    }
}

/* Variables defined step by step across a long text; the answer shows the chain. */
static void gen_var_chain(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    Story st;
    story_init(g, &st);
    static const char names[] = "abcdefgh";
    int n = range(r, 3, 6), val[6], k[6];
    char op[6], facts[6][160];
    val[0] = range(r, 2, 60);
    snprintf(facts[0], sizeof facts[0], "Let %c = %d.", names[0], val[0]);
    for (int i = 1; i < n; i++) {
        program_step(g, val[i - 1], &op[i], &k[i], &val[i]);
        snprintf(facts[i], sizeof facts[i], "Let %c = %c %c %d.", names[i], names[i - 1], op[i], k[i]);
    }
    weave(g, &st, o, (size_t)range(r, LONG_MIN, LONG_MAX), facts, n);
    s_printf(o, "\n\nQ: What is %c? A: %c = %d", names[n - 1], names[0], val[0]);
    for (int i = 1; i < n; i++) s_printf(o, ", %c = %d %c %d = %d", names[i], val[i - 1], op[i], k[i], val[i]);
    s_printf(o, ". The answer is %d.", val[n - 1]);
}

/* Containment chain: thing in container, container in room. */
static void gen_location_chain(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    Story st;
    story_init(g, &st);
    const char *thing = PICK(r, OBJECTS), *color = PICK(r, COLORS), *cont = PICK(r, CONTAINERS), *room = PICK(r, ROOMS);
    const char *room2;
    do room2 = PICK(r, ROOMS);
    while (room2 == room);
    char facts[3][160];
    snprintf(facts[0], sizeof facts[0], "The %s is in the %s %s.", thing, color, cont);
    snprintf(facts[1], sizeof facts[1], "The %s %s is in the %s.", color, cont, room);
    snprintf(facts[2], sizeof facts[2], "The %s is next to the %s.", room, room2);
    weave(g, &st, o, (size_t)range(r, LONG_MIN, LONG_MAX), facts, 3);
    s_printf(o, "\n\nQ: Where is the %s? A: The %s is in the %s %s, and the %s %s is in the %s. So the %s is in the %s.",
             thing, thing, color, cont, color, cont, room, thing, room);
}

/* Ordering chain: A older than B older than C ... */
static void gen_order_chain(Gen *g, Str *o) {
    ZyRng *r = &g->rng;
    Story st;
    story_init(g, &st);
    int n = range(r, 3, 5), idx[5];
    for (int i = 0; i < n; i++) {
        int ok;
        do {
            idx[i] = (int)rnd(r, ZY_ARRAY_LEN(PEOPLE));
            ok = 1;
            for (int j = 0; j < i; j++) ok &= idx[j] != idx[i];
        } while (!ok);
    }
    static const char *const rel[][2] = {{"older", "oldest"}, {"taller", "tallest"}, {"faster", "fastest"}};
    int k = (int)rnd(r, 3);
    char facts[4][160];
    for (int i = 0; i + 1 < n; i++)
        snprintf(facts[i], sizeof facts[i], "%s is %s than %s.", PEOPLE[idx[i]].name, rel[k][0], PEOPLE[idx[i + 1]].name);
    /* state them in a shuffled order so the chain has to be assembled */
    for (int i = n - 2; i > 0; i--) {
        int j = (int)rnd(r, (uint32_t)i + 1);
        char t[160];
        memcpy(t, facts[i], sizeof t);
        memcpy(facts[i], facts[j], sizeof t);
        memcpy(facts[j], t, sizeof t);
    }
    weave(g, &st, o, (size_t)range(r, LONG_MIN, LONG_MAX), facts, n - 1);
    s_printf(o, "\n\nQ: Who is the %s? A: ", rel[k][1]);
    for (int i = 0; i + 1 < n; i++)
        s_printf(o, "%s%s is %s than %s", i ? ", " : "", PEOPLE[idx[i]].name, rel[k][0], PEOPLE[idx[i + 1]].name);
    s_printf(o, ". So %s is the %s.", PEOPLE[idx[0]].name, rel[k][1]);
}

static void gen_longctx_doc(Gen *g, Str *o) {
    int k = (int)rnd(&g->rng, 100);
    if (k < 50) {
        gen_kv(g, o, 0, NULL);
    } else if (k < 70) {
        gen_var_chain(g, o);
    } else if (k < 85) {
        gen_location_chain(g, o);
    } else {
        gen_order_chain(g, o);
    }
}

/* ------------------------------------------------------------------------------------------------ guard */

/* 1 if two held-out 2-digit numbers and their sum occur among 5 consecutive numbers of the text. */
static int leaks_heldout(const Gen *g, const char *s, size_t n) {
    long nums[5];
    int cnt = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] < '0' || s[i] > '9') {
            i++;
            continue;
        }
        long v = 0;
        int digits = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (digits < 9) v = v * 10 + (s[i] - '0');
            digits++;
            i++;
        }
        if (digits > 9) v = -1;
        if (cnt == 5) {
            memmove(nums, nums + 1, 4 * sizeof nums[0]);
            cnt = 4;
        }
        nums[cnt++] = v;
        /* triples involving the newest number; the older ones were checked already */
        int z = cnt - 1;
        for (int x = 0; x < cnt; x++)
            for (int y = 0; y < cnt; y++) {
                if (x == y) continue;
                long a = nums[x], b = nums[y];
                if (a < 10 || a > 99 || b < 10 || b > 99 || !held(g, a, b)) continue;
                for (int c = 0; c < cnt; c++) {
                    if (c == x || c == y) continue;
                    if ((x == z || y == z || c == z) && nums[c] == a + b) return 1;
                }
            }
    }
    return 0;
}

/* -------------------------------------------------------------------------------------------- output */

typedef struct {
    FILE *f;
    char tmp[4200], path[4096];
    SynthFileCount *count;
} Out;

static int out_open(Out *o, const char *dir, const char *name, const char *label, SynthReport *rep, ZyErr *err) {
    memset(o, 0, sizeof *o);
    if (rep->n_files >= SYNTH_MAX_FILES) return zy_fail(err, "synth: too many files");
    if (zy_path_join(o->path, sizeof o->path, dir, name, err)) return -1;
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", o->path, (long)getpid());
    o->f = fopen(o->tmp, "wb");
    if (!o->f) return zy_fail(err, "%s: cannot create: %s", o->tmp, strerror(errno));
    o->count = &rep->files[rep->n_files++];
    memset(o->count, 0, sizeof *o->count);
    snprintf(o->count->name, sizeof o->count->name, "%s", label);
    return 0;
}

static int out_close(Out *o, ZyErr *err) {
    if (!o->f) return 0;
    int bad = ferror(o->f) || fflush(o->f) != 0 || fsync(fileno(o->f)) != 0;
    bad |= fclose(o->f) != 0;
    o->f = NULL;
    if (bad) {
        unlink(o->tmp);
        return zy_fail(err, "%s: write failed: %s", o->tmp, strerror(errno));
    }
    if (rename(o->tmp, o->path) != 0) {
        unlink(o->tmp);
        return zy_fail(err, "%s: rename failed: %s", o->path, strerror(errno));
    }
    return 0;
}

static void out_abort(Out *o) {
    if (!o->f) return;
    fclose(o->f);
    o->f = NULL;
    unlink(o->tmp);
}

static void json_str(Str *o, const char *s, size_t n) {
    s_putc(o, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') s_put(o, "\\\"");
        else if (c == '\\') s_put(o, "\\\\");
        else if (c == '\n') s_put(o, "\\n");
        else if (c == '\t') s_put(o, "\\t");
        else if (c < 0x20) s_printf(o, "\\u%04x", c);
        else s_putc(o, (char)c);
    }
    s_putc(o, '"');
}

static void out_line(Out *o, const Str *line) {
    fwrite(line->p, 1, line->n, o->f);
    o->count->records++;
    o->count->bytes += line->n;
}

/* ---------------------------------------------------------------------------------------------- driver */

void synth_heldout_init(SynthHeldout *h, uint64_t seed) {
    memset(h, 0, sizeof *h);
    uint16_t pairs[4095];
    int n = 0;
    for (int a = 10; a <= 99; a++)
        for (int b = a; b <= 99; b++) pairs[n++] = (uint16_t)(a * 100 + b);
    ZyRng r;
    zy_rng_seed(&r, seed ^ 0x484f4c444f5554ull); /* "HOLDOUT": its own stream */
    int take = (n + 5) / 10;
    for (int i = 0; i < take; i++) {
        int j = i + (int)rnd(&r, (uint32_t)(n - i));
        uint16_t t = pairs[i];
        pairs[i] = pairs[j];
        pairs[j] = t;
        int a = pairs[i] / 100, b = pairs[i] % 100;
        h->held[a][b] = h->held[b][a] = 1;
    }
    h->n_unordered = take;
}

int synth_is_heldout(const SynthHeldout *h, long a, long b) {
    return a >= 10 && a <= 99 && b >= 10 && b <= 99 && h->held[a][b];
}

static void gen_seed(Gen *g, uint64_t seed, int stream) {
    zy_rng_seed(&g->rng, seed + 0x9E3779B97F4A7C15ull * (uint64_t)(stream + 1));
}

/* Shuffles the 4 choices in place; returns the new index of choice 0. */
static int shuffle_choices(ZyRng *r, char (*c)[512], int n) {
    int correct = 0;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rnd(r, (uint32_t)i + 1);
        char t[512];
        memcpy(t, c[i], sizeof t);
        memcpy(c[i], c[j], sizeof t);
        memcpy(c[j], t, sizeof t);
        if (correct == i) correct = j;
        else if (correct == j) correct = i;
    }
    return correct;
}

static void mc_line(Str *line, const char *ctx, size_t ctx_len, char (*choices)[512], int n, int answer) {
    s_clear(line);
    s_put(line, "{\"context\": ");
    json_str(line, ctx, ctx_len);
    s_put(line, ", \"choices\": [");
    for (int i = 0; i < n; i++) {
        if (i) s_put(line, ", ");
        json_str(line, choices[i], strlen(choices[i]));
    }
    s_printf(line, "], \"answer\": %d}\n", answer);
}

static void qa_line(Str *line, const char *prompt, size_t n, const char *answer) {
    s_clear(line);
    s_put(line, "{\"prompt\": ");
    json_str(line, prompt, n);
    s_put(line, ", \"answer\": ");
    json_str(line, answer, strlen(answer));
    s_put(line, "}\n");
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Distinct wrong answers near c. */
static void distractors(ZyRng *r, int c, char (*ch)[512]) {
    int got[4] = {c, -1, -1, -1}, n = 1;
    const int deltas[] = {1, -1, 10, -10, 2, -2, 11, -11, 9, -9, 20, -20};
    while (n < 4) {
        int d = c + deltas[rnd(r, ZY_ARRAY_LEN(deltas))];
        int dup = d < 0;
        for (int i = 0; i < n; i++) dup |= got[i] == d;
        if (!dup) got[n++] = d;
    }
    for (int i = 0; i < 4; i++) snprintf(ch[i], sizeof ch[i], "%d", got[i]);
}

static int scramble(ZyRng *r, const char *sent, char *out, size_t cap) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", sent);
    size_t len = strlen(buf);
    if (len && buf[len - 1] == '.') buf[--len] = '\0';
    char *words[64];
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ", &save); tok && n < 64; tok = strtok_r(NULL, " ", &save)) words[n++] = tok;
    if (n < 3) return -1;
    int is_name = 0;
    for (size_t i = 0; i < ZY_ARRAY_LEN(PEOPLE); i++) is_name |= strcmp(words[0], PEOPLE[i].name) == 0;
    if (!is_name && words[0][0] >= 'A' && words[0][0] <= 'Z') words[0][0] = (char)(words[0][0] - 'A' + 'a');
    for (int tries = 0; tries < 10; tries++) {
        for (int i = n - 1; i > 0; i--) {
            int j = (int)rnd(r, (uint32_t)i + 1);
            char *t = words[i];
            words[i] = words[j];
            words[j] = t;
        }
        size_t p = 0;
        for (int i = 0; i < n && p < cap; i++)
            p += (size_t)snprintf(out + p, cap - p, "%s%s", i ? " " : "", words[i]);
        if (p + 2 >= cap) return -1;
        out[p++] = '.';
        out[p] = '\0';
        if (out[0] >= 'a' && out[0] <= 'z') out[0] = (char)(out[0] - 'a' + 'A');
        if (strcmp(out, sent) != 0) return 0;
    }
    return -1;
}

static int write_eval(Gen *g, const char *dir, uint64_t seed, SynthReport *rep, ZyErr *err) {
    char edir[4096];
    if (zy_path_join(edir, sizeof edir, dir, "eval", err) || zy_mkdirs(edir, err)) return -1;
    Out o;
    Str line = {0}, doc = {0}, ans = {0};
    ZyRng *r = &g->rng;
    char ch[4][512];
    int rc = -1;

    /* addition2: every held-out ordered pair, shuffled */
    gen_seed(g, seed, 10);
    if (out_open(&o, edir, "addition2.jsonl", "eval/addition2.jsonl", rep, err)) goto done;
    {
        int pairs[8100], n = 0;
        for (int a = 10; a <= 99; a++)
            for (int b = 10; b <= 99; b++)
                if (held(g, a, b)) pairs[n++] = a * 100 + b;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)rnd(r, (uint32_t)i + 1), t = pairs[i];
            pairs[i] = pairs[j];
            pairs[j] = t;
        }
        for (int i = 0; i < n; i++) {
            char p[32], a[16];
            int x = pairs[i] / 100, y = pairs[i] % 100;
            snprintf(p, sizeof p, "%d+%d=", x, y);
            snprintf(a, sizeof a, "%d", x + y);
            qa_line(&line, p, strlen(p), a);
            out_line(&o, &line);
        }
    }
    if (out_close(&o, err)) goto done;

    /* arith_mc: held-out pairs as a+b= and the inverse c-b= */
    gen_seed(g, seed, 11);
    if (out_open(&o, edir, "arith_mc.jsonl", "eval/arith_mc.jsonl", rep, err)) goto done;
    for (int i = 0; i < 400; i++) {
        int a, b;
        do {
            a = range(r, 10, 99);
            b = range(r, 10, 99);
        } while (!held(g, a, b));
        char ctx[32];
        int answer_value;
        if (chance(r, 70)) {
            snprintf(ctx, sizeof ctx, "%d+%d=", a, b);
            answer_value = a + b;
        } else {
            snprintf(ctx, sizeof ctx, "%d-%d=", a + b, b);
            answer_value = a;
        }
        distractors(r, answer_value, ch);
        int ans_i = shuffle_choices(r, ch, 4);
        mc_line(&line, ctx, strlen(ctx), ch, 4, ans_i);
        out_line(&o, &line);
    }
    if (out_close(&o, err)) goto done;

    /* kv_recall: held-out keys */
    gen_seed(g, seed, 12);
    if (out_open(&o, edir, "kv_recall.jsonl", "eval/kv_recall.jsonl", rep, err)) goto done;
    for (int i = 0; i < 200; i++) {
        s_clear(&doc);
        s_clear(&ans);
        gen_kv(g, &doc, 1, &ans);
        if (doc.oom || ans.oom) break;
        qa_line(&line, doc.p, doc.n, ans.p);
        out_line(&o, &line);
    }
    if (out_close(&o, err)) goto done;

    /* general_mc: attribute consistency, pronoun agreement, grammatical word order */
    gen_seed(g, seed, 13);
    if (out_open(&o, edir, "general_mc.jsonl", "eval/general_mc.jsonl", rep, err)) goto done;
    for (int i = 0; i < 300;) {
        Story st;
        story_init(g, &st);
        s_clear(&doc);
        sentence(g, &st, PICK(r, T_OPEN), &doc);
        int kind = i % 3, n_ch = 4, answer = 0;
        if (kind == 0) {
            sentence(g, &st, PICK(r, T_HAVE), &doc);
            int n = range(r, 1, 4);
            for (int k = 0; k < n; k++) sentence(g, &st, PICK(r, T_EVENT), &doc);
            s_put(&doc, " The ");
            s_put(&doc, st.obj);
            s_put(&doc, " was");
            int cols[4] = {0};
            for (int k = 0; k < 4; k++) {
                int ok;
                do {
                    cols[k] = (int)rnd(r, ZY_ARRAY_LEN(COLORS));
                    ok = k ? strcmp(COLORS[cols[k]], st.color) != 0 : 1;
                    for (int j = 1; j < k; j++) ok &= cols[j] != cols[k];
                } while (!ok);
                snprintf(ch[k], sizeof ch[k], " %s.", k ? COLORS[cols[k]] : st.color);
            }
            answer = shuffle_choices(r, ch, 4);
        } else if (kind == 1) {
            int n = range(r, 1, 3);
            for (int k = 0; k < n; k++) sentence(g, &st, PICK(r, T_EVENT), &doc);
            const char *e = PICK(r, EMOTIONS), *v = PICK(r, VI);
            s_printf(&doc, " %s was %s, so", st.hero->name, e);
            snprintf(ch[0], sizeof ch[0], " %s %s.", SUBJ[st.hero->she], v);
            snprintf(ch[1], sizeof ch[1], " %s %s.", SUBJ[!st.hero->she], v);
            n_ch = 2;
            answer = shuffle_choices(r, ch, 2);
        } else {
            int n = range(r, 1, 3);
            for (int k = 0; k < n; k++) sentence(g, &st, PICK(r, T_EVENT), &doc);
            s_clear(&ans);
            expand(g, &st, PICK(r, T_EVENT), &ans);
            if (ans.oom || strlen(ans.p) > 400) continue;
            snprintf(ch[0], sizeof ch[0], " %s", ans.p);
            int bad = 0;
            for (int k = 1; k < 4 && !bad; k++) {
                ch[k][0] = ' ';
                bad = scramble(r, ans.p, ch[k] + 1, sizeof ch[k] - 1) != 0;
                for (int j = 0; j < k && !bad; j++) bad = strcmp(ch[j], ch[k]) == 0;
            }
            if (bad) continue;
            answer = shuffle_choices(r, ch, 4);
        }
        if (doc.oom) break;
        mc_line(&line, doc.p, doc.n, ch, n_ch, answer);
        out_line(&o, &line);
        i++;
    }
    if (out_close(&o, err)) goto done;

    /* code_exec: distinct programs; their hashes keep them out of training */
    gen_seed(g, seed, 14);
    if (out_open(&o, edir, "code_exec.jsonl", "eval/code_exec.jsonl", rep, err)) goto done;
    g->prog_hashes = calloc(300, sizeof *g->prog_hashes);
    if (!g->prog_hashes) {
        zy_fail(err, "out of memory");
        out_abort(&o);
        goto done;
    }
    for (int tries = 0; g->n_prog_hashes < 300 && tries < 100000; tries++) {
        s_clear(&doc);
        s_clear(&ans);
        gen_program(g, &doc, &ans);
        if (doc.oom || ans.oom) break;
        uint64_t h = fnv1a(doc.p, doc.n);
        int dup = 0;
        for (size_t k = 0; k < g->n_prog_hashes; k++) dup |= g->prog_hashes[k] == h;
        if (dup) continue;
        g->prog_hashes[g->n_prog_hashes++] = h;
        s_put(&doc, "\noutput:");
        qa_line(&line, doc.p, doc.n, ans.p);
        out_line(&o, &line);
    }
    qsort(g->prog_hashes, g->n_prog_hashes, sizeof *g->prog_hashes, cmp_u64);
    if (out_close(&o, err)) goto done;
    rc = 0;
done:
    if (rc == 0 && (line.oom || doc.oom || ans.oom)) rc = zy_fail(err, "synth: out of memory");
    s_free(&line);
    s_free(&doc);
    s_free(&ans);
    return rc;
}

static int write_training(Gen *g, const char *dir, const char *name, int stream, uint64_t seed, uint64_t target,
                          void (*gen)(Gen *, Str *), SynthReport *rep, ZyErr *err) {
    Out o;
    if (out_open(&o, dir, name, name, rep, err)) return -1;
    gen_seed(g, seed, stream);
    Str doc = {0}, line = {0};
    while (o.count->bytes < target) {
        s_clear(&doc);
        gen(g, &doc);
        if (doc.oom || !doc.p) break;
        if (leaks_heldout(g, doc.p, doc.n)) continue; /* rare coincidence across problems: draw again */
        s_clear(&line);
        s_put(&line, "{\"text\": ");
        json_str(&line, doc.p, doc.n);
        s_put(&line, "}\n");
        if (line.oom) break;
        out_line(&o, &line);
    }
    int oom = doc.oom || line.oom || !doc.p;
    s_free(&doc);
    s_free(&line);
    if (oom) {
        out_abort(&o);
        return zy_fail(err, "synth: out of memory");
    }
    return out_close(&o, err);
}

static const char README[] =
    "Synthetic curriculum corpus written by `zaya data synth` (seed %llu, scale %g).\n"
    "Every byte follows from the seed: the same seed gives the same files on every machine.\n"
    "\n"
    "Training data, JSON Lines, one document per line as {\"text\": ...}:\n"
    "  general.jsonl   phase 1 (web-like text): procedural prose from grammars: stories with dialogue,\n"
    "                  descriptions of places and animals, letters, diaries, news items, instructions, scripts.\n"
    "  mathcode.jsonl  phase 2 (math/code): arithmetic drills (\"23+58=81\"), questions in many formats\n"
    "                  (\"What is 17 plus 45? 62\"), subtraction, multiplication, division, 3-4 digit sums,\n"
    "                  multi-step word problems with the working shown, and small programs followed by\n"
    "                  \"output: <value>\".\n"
    "  longctx.jsonl   phase 3 (long context + reasoning): 0.5-3 KB documents with facts scattered through\n"
    "                  filler prose, then questions: key-value recall (\"The code for falcon is 4821.\" ...\n"
    "                  \"Q: What is the code for falcon? A: 4821\"), variable chains (\"Let b = a + 7.\"),\n"
    "                  containment chains and ordering chains, with the reasoning written out in the answer.\n"
    "\n"
    "Held-out evaluation tasks in eval/ (prompts end where the answer begins; compare after trimming spaces):\n"
    "  addition2.jsonl   exact match, {\"prompt\": \"47+38=\", \"answer\": \"85\"}: all %d ordered pairs of a\n"
    "                    seeded 10%% (%d) of the unordered 2-digit pairs {a, b}. No training document states\n"
    "                    a+b or b+a for these pairs in any format, nor the inverse (a+b)-b=a.\n"
    "  arith_mc.jsonl    multiple choice, {\"context\": \"12+45=\", \"choices\": [...], \"answer\": index}, on\n"
    "                    the same held-out pairs (additions and inverse subtractions).\n"
    "  kv_recall.jsonl   exact match: a 0.4-0.9 KB context with 3-6 key-value facts among filler, then\n"
    "                    \"Q: What is the code for <key>? A:\"; no training document has a fact for these keys.\n"
    "  general_mc.jsonl  multiple choice on the prose: the consistent colour of an object introduced earlier,\n"
    "                    the pronoun that agrees with the character, the grammatical sentence among word-order\n"
    "                    scrambles. Choices start with a space.\n"
    "  code_exec.jsonl   exact match: a program followed by \"output:\", answer its printed value; these\n"
    "                    programs never occur in training.\n"
    "\n"
    "Counts (records, bytes):\n";

static int write_readme(const char *dir, uint64_t seed, double scale, const SynthHeldout *ho,
                        const SynthReport *rep, ZyErr *err) {
    Str s = {0};
    int ordered = 0;
    for (int a = 10; a <= 99; a++)
        for (int b = 10; b <= 99; b++) ordered += ho->held[a][b];
    s_printf(&s, README, (unsigned long long)seed, scale, ordered, ho->n_unordered);
    for (int i = 0; i < rep->n_files; i++)
        s_printf(&s, "  %-22s %8llu %10llu\n", rep->files[i].name, (unsigned long long)rep->files[i].records,
                 (unsigned long long)rep->files[i].bytes);
    char path[4096];
    int rc = s.oom ? zy_fail(err, "synth: out of memory") : 0;
    if (!rc) rc = zy_path_join(path, sizeof path, dir, "README.txt", err);
    if (!rc) rc = zy_write_file_atomic(path, s.p, s.n, err);
    s_free(&s);
    return rc;
}

int synth_generate(const char *dir, uint64_t seed, double scale, SynthReport *rep, ZyErr *err) {
    double t0 = zy_now_seconds();
    memset(rep, 0, sizeof *rep);
    if (!(scale > 0 && scale <= 100)) return zy_fail(err, "synth: scale must be in (0, 100], got %g", scale);
    if (zy_mkdirs(dir, err)) return -1;
    SynthHeldout *ho = malloc(sizeof *ho);
    Gen *g = calloc(1, sizeof *g);
    if (!ho || !g) {
        free(ho);
        free(g);
        return zy_fail(err, "out of memory");
    }
    synth_heldout_init(ho, seed);
    g->ho = ho;
    /* a seeded fifth of the recall keys is reserved for eval/kv_recall */
    ZyRng kr;
    zy_rng_seed(&kr, seed ^ 0x4b5645564b4559ull);
    int order[ZY_ARRAY_LEN(KV_KEYS)], nk = (int)ZY_ARRAY_LEN(KV_KEYS);
    for (int i = 0; i < nk; i++) order[i] = i;
    for (int i = 0; i < nk / 5; i++) {
        int j = i + (int)rnd(&kr, (uint32_t)(nk - i)), t = order[i];
        order[i] = order[j];
        order[j] = t;
        g->kv_eval[order[i]] = 1;
    }
    int rc = write_eval(g, dir, seed, rep, err);
    /* training files: sizes are deterministic in (seed, scale) because each stops at a byte count */
    if (!rc)
        rc = write_training(g, dir, "general.jsonl", 0, seed, (uint64_t)(scale * SYNTH_GENERAL_BYTES), gen_general_doc,
                            rep, err);
    if (!rc)
        rc = write_training(g, dir, "mathcode.jsonl", 1, seed, (uint64_t)(scale * SYNTH_MATHCODE_BYTES),
                            gen_mathcode_doc, rep, err);
    if (!rc)
        rc = write_training(g, dir, "longctx.jsonl", 2, seed, (uint64_t)(scale * SYNTH_LONGCTX_BYTES), gen_longctx_doc,
                            rep, err);
    if (!rc) {
        /* list training files first */
        SynthFileCount eval[SYNTH_MAX_FILES];
        int ne = 5;
        memcpy(eval, rep->files, (size_t)ne * sizeof eval[0]);
        memmove(rep->files, rep->files + ne, (size_t)(rep->n_files - ne) * sizeof eval[0]);
        memcpy(rep->files + rep->n_files - ne, eval, (size_t)ne * sizeof eval[0]);
        rc = write_readme(dir, seed, scale, ho, rep, err);
    }
    s_free(&g->tmp);
    s_free(&g->tmp2);
    free(g->prog_hashes);
    free(g);
    free(ho);
    rep->seconds = zy_now_seconds() - t0;
    return rc;
}
