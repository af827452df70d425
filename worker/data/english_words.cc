#include "worker/data/english_words.h"

namespace pipetrain {
namespace english {
namespace {

template <typename T, size_t N>
List<T> Of(const T (&items)[N]) {
  return {items, N};
}

constexpr Noun kCreatures[] = {
    {"man", "men"},
    {"woman", "women"},
    {"child", "children"},
    {"boy", "boys"},
    {"girl", "girls"},
    {"baby", "babies"},
    {"friend", "friends"},
    {"mother", "mothers"},
    {"father", "fathers"},
    {"brother", "brothers"},
    {"sister", "sisters"},
    {"teacher", "teachers"},
    {"student", "students"},
    {"doctor", "doctors"},
    {"farmer", "farmers"},
    {"baker", "bakers"},
    {"nurse", "nurses"},
    {"pilot", "pilots"},
    {"driver", "drivers"},
    {"painter", "painters"},
    {"writer", "writers"},
    {"singer", "singers"},
    {"soldier", "soldiers"},
    {"captain", "captains"},
    {"king", "kings"},
    {"queen", "queens"},
    {"neighbour", "neighbours"},
    {"stranger", "strangers"},
    {"guest", "guests"},
    {"lady", "ladies"},
    {"dog", "dogs"},
    {"cat", "cats"},
    {"horse", "horses"},
    {"bird", "birds"},
    {"cow", "cows"},
    {"sheep", "sheep"},
    {"fish", "fish"},
    {"mouse", "mice"},
    {"wolf", "wolves"},
    {"fox", "foxes"},
    {"rabbit", "rabbits"},
};

constexpr Noun kThings[] = {
    {"book", "books"},         {"letter", "letters"},
    {"key", "keys"},           {"coin", "coins"},
    {"picture", "pictures"},   {"song", "songs"},
    {"story", "stories"},      {"game", "games"},
    {"ball", "balls"},         {"hat", "hats"},
    {"coat", "coats"},         {"shoe", "shoes"},
    {"cup", "cups"},           {"bottle", "bottles"},
    {"apple", "apples"},       {"cake", "cakes"},
    {"flower", "flowers"},     {"box", "boxes"},
    {"bag", "bags"},           {"lamp", "lamps"},
    {"clock", "clocks"},       {"map", "maps"},
    {"pen", "pens"},           {"knife", "knives"},
    {"plate", "plates"},       {"spoon", "spoons"},
    {"basket", "baskets"},     {"candle", "candles"},
    {"ring", "rings"},         {"mirror", "mirrors"},
    {"stone", "stones"},       {"leaf", "leaves"},
    {"ship", "ships"},         {"boat", "boats"},
    {"car", "cars"},           {"wheel", "wheels"},
    {"engine", "engines"},     {"machine", "machines"},
    {"window", "windows"},     {"door", "doors"},
    {"chair", "chairs"},       {"table", "tables"},
    {"blanket", "blankets"},   {"newspaper", "newspapers"},
    {"egg", "eggs"},           {"orange", "oranges"},
    {"umbrella", "umbrellas"}, {"gift", "gifts"},
    {"question", "questions"},
};

constexpr Noun kPlaceNouns[] = {
    {"house", "houses"},       {"garden", "gardens"},   {"river", "rivers"},
    {"tree", "trees"},         {"city", "cities"},      {"village", "villages"},
    {"road", "roads"},         {"street", "streets"},   {"school", "schools"},
    {"church", "churches"},    {"market", "markets"},   {"shop", "shops"},
    {"kitchen", "kitchens"},   {"room", "rooms"},       {"bed", "beds"},
    {"table", "tables"},       {"field", "fields"},     {"hill", "hills"},
    {"mountain", "mountains"}, {"forest", "forests"},   {"island", "islands"},
    {"bridge", "bridges"},     {"wall", "walls"},       {"park", "parks"},
    {"lake", "lakes"},         {"sea", "seas"},         {"farm", "farms"},
    {"castle", "castles"},     {"tower", "towers"},     {"station", "stations"},
    {"library", "libraries"},  {"office", "offices"},   {"window", "windows"},
    {"door", "doors"},         {"fire", "fires"},       {"beach", "beaches"},
    {"valley", "valleys"},     {"harbour", "harbours"}, {"square", "squares"},
    {"hall", "halls"},         {"barn", "barns"},       {"gate", "gates"},
};

constexpr const char* kAdjectives[] = {
    "old",    "young",   "small",     "large",   "big",    "little",   "happy",   "sad",
    "quiet",  "loud",    "bright",    "dark",    "warm",   "cold",     "green",   "red",
    "blue",   "white",   "black",     "yellow",  "brown",  "tall",     "short",   "long",
    "heavy",  "light",   "kind",      "clever",  "brave",  "tired",    "hungry",  "busy",
    "gentle", "strange", "beautiful", "careful", "famous", "friendly", "strong",  "weak",
    "rich",   "poor",    "clean",     "dirty",   "empty",  "full",     "soft",    "hard",
    "quick",  "slow",    "wet",       "dry",     "new",    "ancient",  "wooden",  "golden",
    "narrow", "wide",    "deep",      "calm",    "proud",  "lonely",   "curious", "patient",
    "polite", "simple",  "sweet",     "fresh",   "noisy",  "pleasant", "ugly",    "angry",
    "early",  "silent",  "round",     "sharp",   "lucky",
};

constexpr Verb kTransitiveVerbs[] = {
    {"see", "sees", "saw"},
    {"find", "finds", "found"},
    {"take", "takes", "took"},
    {"carry", "carries", "carried"},
    {"open", "opens", "opened"},
    {"close", "closes", "closed"},
    {"watch", "watches", "watched"},
    {"follow", "follows", "followed"},
    {"visit", "visits", "visited"},
    {"paint", "paints", "painted"},
    {"build", "builds", "built"},
    {"buy", "buys", "bought"},
    {"sell", "sells", "sold"},
    {"bring", "brings", "brought"},
    {"hold", "holds", "held"},
    {"read", "reads", "read"},
    {"clean", "cleans", "cleaned"},
    {"fix", "fixes", "fixed"},
    {"love", "loves", "loved"},
    {"like", "likes", "liked"},
    {"help", "helps", "helped"},
    {"call", "calls", "called"},
    {"meet", "meets", "met"},
    {"leave", "leaves", "left"},
    {"keep", "keeps", "kept"},
    {"lose", "loses", "lost"},
    {"want", "wants", "wanted"},
    {"need", "needs", "needed"},
    {"remember", "remembers", "remembered"},
    {"forget", "forgets", "forgot"},
    {"push", "pushes", "pushed"},
    {"pull", "pulls", "pulled"},
    {"wash", "washes", "washed"},
    {"catch", "catches", "caught"},
    {"throw", "throws", "threw"},
    {"show", "shows", "showed"},
    {"draw", "draws", "drew"},
    {"hear", "hears", "heard"},
    {"notice", "notices", "noticed"},
    {"touch", "touches", "touched"},
    {"move", "moves", "moved"},
    {"count", "counts", "counted"},
    {"enjoy", "enjoys", "enjoyed"},
    {"fill", "fills", "filled"},
    {"hide", "hides", "hid"},
    {"choose", "chooses", "chose"},
    {"admire", "admires", "admired"},
    {"greet", "greets", "greeted"},
    {"feed", "feeds", "fed"},
    {"describe", "describes", "described"},
};

constexpr Verb kIntransitiveVerbs[] = {
    {"walk", "walks", "walked"},
    {"run", "runs", "ran"},
    {"sleep", "sleeps", "slept"},
    {"sit", "sits", "sat"},
    {"stand", "stands", "stood"},
    {"wait", "waits", "waited"},
    {"laugh", "laughs", "laughed"},
    {"sing", "sings", "sang"},
    {"dance", "dances", "danced"},
    {"swim", "swims", "swam"},
    {"work", "works", "worked"},
    {"play", "plays", "played"},
    {"rest", "rests", "rested"},
    {"travel", "travels", "travelled"},
    {"smile", "smiles", "smiled"},
    {"jump", "jumps", "jumped"},
    {"stay", "stays", "stayed"},
    {"listen", "listens", "listened"},
    {"talk", "talks", "talked"},
    {"shout", "shouts", "shouted"},
    {"climb", "climbs", "climbed"},
    {"hurry", "hurries", "hurried"},
    {"wander", "wanders", "wandered"},
    {"live", "lives", "lived"},
    {"go", "goes", "went"},
    {"come", "comes", "came"},
    {"return", "returns", "returned"},
    {"arrive", "arrives", "arrived"},
};

constexpr const char* kAdverbs[] = {
    "slowly",  "quickly", "quietly", "happily",    "carefully", "softly",  "loudly",
    "gently",  "early",   "late",    "alone",      "together",  "again",   "well",
    "calmly",  "sadly",   "eagerly", "patiently",  "politely",  "bravely", "for a while",
    "all day", "at last", "at once", "in silence",
};

constexpr const char* kPlacePrepositions[] = {
    "in", "on", "under", "near", "behind", "beside", "by", "inside", "outside", "above",
};

constexpr const char* kMotionPrepositions[] = {
    "to", "toward", "into", "across", "along", "through", "around", "past", "over", "from",
};

constexpr const char* kTimePhrases[] = {
    "in the morning",
    "in the evening",
    "at night",
    "after dinner",
    "before breakfast",
    "on Sunday",
    "every day",
    "later",
    "then",
    "after a while",
    "at noon",
    "in the summer",
    "in the winter",
    "during the storm",
    "for a long time",
    "one day",
    "soon after",
    "at first",
};

constexpr const char* kNames[] = {
    "Anna",   "Tom",   "Mary",   "John",  "Peter", "Sarah", "James",  "Emma",
    "David",  "Lucy",  "Paul",   "Alice", "Mark",  "Kate",  "Henry",  "Jane",
    "Robert", "Grace", "Oliver", "Laura", "Sam",   "Ella",  "George", "Rose",
};

constexpr const char* kSingularDeterminers[] = {
    "the", "the", "the", "a", "a", "this", "that", "every", "my", "his", "her", "our", "their",
};

constexpr const char* kPluralDeterminers[] = {
    "the",   "the",     "some", "many", "these", "those",   "two",
    "three", "several", "my",   "our",  "their", "all the", "a few",
};

constexpr const char* kConjunctions[] = {"and", "and", "but", "so", "while", "because"};

}  // namespace

List<Noun> Creatures() { return Of(kCreatures); }
List<Noun> Things() { return Of(kThings); }
List<Noun> PlaceNouns() { return Of(kPlaceNouns); }
List<const char*> Adjectives() { return Of(kAdjectives); }
List<Verb> TransitiveVerbs() { return Of(kTransitiveVerbs); }
List<Verb> IntransitiveVerbs() { return Of(kIntransitiveVerbs); }
List<const char*> Adverbs() { return Of(kAdverbs); }
List<const char*> PlacePrepositions() { return Of(kPlacePrepositions); }
List<const char*> MotionPrepositions() { return Of(kMotionPrepositions); }
List<const char*> TimePhrases() { return Of(kTimePhrases); }
List<const char*> Names() { return Of(kNames); }
List<const char*> SingularDeterminers() { return Of(kSingularDeterminers); }
List<const char*> PluralDeterminers() { return Of(kPluralDeterminers); }
List<const char*> Conjunctions() { return Of(kConjunctions); }

}  // namespace english
}  // namespace pipetrain
