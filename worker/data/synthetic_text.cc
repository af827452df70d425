#include "worker/data/synthetic_text.h"

#include <cctype>
#include <string_view>

#include "common/philox.h"
#include "worker/data/english_words.h"

namespace pipetrain {
namespace {

using english::List;
using english::Noun;
using english::Verb;

enum class Tense { kPast, kPresent };

// A stream of random 32-bit words: Philox4x32 blocks under the seed's key,
// counter 0, 1, 2, ... (so the whole text is a pure function of the seed).
class RandomStream {
 public:
  explicit RandomStream(uint64_t seed) : key_(KeyFromSeed(seed)) {}

  uint32_t Next() {
    if (used_ == 4) {
      block_ = Philox4x32({static_cast<uint32_t>(counter_), static_cast<uint32_t>(counter_ >> 32),
                           0x54584554u /* "TEXT" */, 0},
                          key_);
      ++counter_;
      used_ = 0;
    }
    return block_[used_++];
  }
  // Uniform in [0, n) by multiply-shift; the bias (< n / 2^32) is irrelevant here.
  size_t Below(size_t n) { return static_cast<size_t>((static_cast<uint64_t>(Next()) * n) >> 32); }
  bool Percent(int p) { return Below(100) < static_cast<size_t>(p); }
  template <typename T>
  const T& Pick(List<T> list) {
    return list.items[Below(list.size)];
  }

 private:
  PhiloxKey key_;
  PhiloxCounter block_{};
  uint64_t counter_ = 0;
  int used_ = 4;
};

bool StartsWithVowel(std::string_view word) {
  return !word.empty() && std::string_view("aeiou").find(word[0]) != std::string_view::npos;
}

// Builds sentences word by word; see the templates in Sentence().
class ProseWriter {
 public:
  explicit ProseWriter(uint64_t seed) : rng_(seed) {}

  void AppendParagraph(std::string* out) {
    const int sentences = 3 + static_cast<int>(rng_.Below(5));
    for (int i = 0; i < sentences; ++i) {
      if (i > 0) out->push_back(' ');
      out->append(Sentence());
    }
  }

 private:
  // "the old dog", "some children", "an apple": sets *plural.
  std::string NounPhrase(List<Noun> nouns, bool* plural) {
    *plural = rng_.Percent(30);
    const Noun& noun = rng_.Pick(nouns);
    std::string adjective = rng_.Percent(40) ? rng_.Pick(english::Adjectives()) : "";
    std::string next = adjective.empty() ? (*plural ? noun.many : noun.one) : adjective;
    std::string det = *plural ? rng_.Pick(english::PluralDeterminers())
                              : rng_.Pick(english::SingularDeterminers());
    if (det == "a" && StartsWithVowel(next)) det = "an";
    std::string phrase = det + " ";
    if (!adjective.empty()) phrase += adjective + " ";
    return phrase + (*plural ? noun.many : noun.one);
  }

  // An acting subject: a name, a pronoun or a person or animal.
  std::string Subject(bool* plural) {
    const size_t kind = rng_.Below(100);
    if (kind < 20) {
      *plural = false;
      return rng_.Pick(english::Names());
    }
    if (kind < 30) {
      static constexpr const char* kPronouns[] = {"he", "she", "they", "we"};
      const size_t p = rng_.Below(4);
      *plural = p >= 2;
      return kPronouns[p];
    }
    return NounPhrase(english::Creatures(), plural);
  }

  std::string Object() {
    if (rng_.Percent(12)) return rng_.Pick(english::Names());
    if (rng_.Percent(5)) return rng_.Percent(50) ? "them" : "her";
    bool plural;
    return NounPhrase(rng_.Percent(60) ? english::Things() : english::Creatures(), &plural);
  }

  std::string Place(List<const char*> prepositions) {
    std::string prep = rng_.Pick(prepositions);
    std::string phrase = rng_.Percent(70) ? "the " : (rng_.Percent(50) ? "a " : "our ");
    if (rng_.Percent(30)) phrase += std::string(rng_.Pick(english::Adjectives())) + " ";
    phrase += rng_.Pick(english::PlaceNouns()).one;
    if (phrase.rfind("a ", 0) == 0 && StartsWithVowel(phrase.substr(2))) phrase.insert(1, "n");
    return prep + " " + phrase;
  }

  static const char* Conjugate(const Verb& verb, Tense tense, bool plural) {
    if (tense == Tense::kPast) return verb.past;
    return plural ? verb.base : verb.third;
  }

  static const char* Be(Tense tense, bool plural) {
    if (tense == Tense::kPast) return plural ? "were" : "was";
    return plural ? "are" : "is";
  }

  // "the dog saw a cat", "Anna walks across the field quietly".
  std::string TransitiveClause(Tense tense) {
    bool plural;
    std::string clause = Subject(&plural);
    clause += " ";
    clause += Conjugate(rng_.Pick(english::TransitiveVerbs()), tense, plural);
    return clause + " " + Object();
  }

  std::string IntransitiveClause(Tense tense) {
    bool plural;
    std::string clause = Subject(&plural);
    clause += " ";
    clause += Conjugate(rng_.Pick(english::IntransitiveVerbs()), tense, plural);
    if (rng_.Percent(60)) clause += " " + Place(english::MotionPrepositions());
    if (rng_.Percent(40)) clause += std::string(" ") + rng_.Pick(english::Adverbs());
    return clause;
  }

  // "the lamp was bright", "Anna is very tired and hungry".
  std::string Description(Tense tense) {
    bool plural;
    std::string clause =
        rng_.Percent(50) ? Subject(&plural) : NounPhrase(english::Things(), &plural);
    clause += " ";
    clause += Be(tense, plural);
    if (rng_.Percent(30)) clause += rng_.Percent(50) ? " very" : " rather";
    clause += std::string(" ") + rng_.Pick(english::Adjectives());
    if (rng_.Percent(25)) clause += std::string(" and ") + rng_.Pick(english::Adjectives());
    return clause;
  }

  std::string Clause(Tense tense) {
    const size_t kind = rng_.Below(10);
    if (kind < 5) return TransitiveClause(tense);
    if (kind < 8) return IntransitiveClause(tense);
    return Description(tense);
  }

  std::string Question(Tense tense) {
    bool plural;
    std::string subject = Subject(&plural);
    std::string aux = tense == Tense::kPast ? "did" : (plural ? "do" : "does");
    std::string verb = rng_.Pick(english::TransitiveVerbs()).base;
    return aux + " " + subject + " " + verb + " " + Object() + "?";
  }

  std::string Quote(Tense tense) {
    std::string said = rng_.Percent(50) ? "said " : "asked ";
    std::string speaker = rng_.Pick(english::Names());
    std::string inner = Clause(tense);  // Sentence() capitalises it.
    return "\"" + inner + ",\" " + said + speaker + ".";
  }

  std::string ThereIs(Tense tense) {
    bool plural;
    std::string thing = NounPhrase(english::Things(), &plural);
    return std::string("there ") + Be(tense, plural) + " " + thing + " " +
           Place(english::PlacePrepositions()) + ".";
  }

  // One punctuated sentence, not yet capitalised. Random draws are made
  // in separate statements: the evaluation order of `a + b` is unspecified,
  // and the text must not depend on the compiler.
  std::string SentenceBody(Tense tense) {
    const size_t kind = rng_.Below(20);
    if (kind < 6) return Clause(tense) + ".";
    std::string first;
    std::string second;
    if (kind < 9) {
      first = TransitiveClause(tense);
      second = Place(english::PlacePrepositions());
      return first + " " + second + ".";
    }
    if (kind < 12) {
      first = rng_.Pick(english::TimePhrases());
      second = Clause(tense);
      return first + ", " + second + ".";
    }
    if (kind < 15) {
      first = Clause(tense);
      std::string conjunction = rng_.Pick(english::Conjunctions());
      second = Clause(tense);
      return first + ", " + conjunction + " " + second + ".";
    }
    if (kind < 17) {
      first = IntransitiveClause(tense);
      second = Clause(tense);
      return "when " + first + ", " + second + ".";
    }
    if (kind < 18) return Question(tense);
    if (kind < 19) return Quote(tense);
    return ThereIs(tense);
  }

  // One sentence, capitalised and punctuated.
  std::string Sentence() {
    const Tense tense = rng_.Percent(65) ? Tense::kPast : Tense::kPresent;
    std::string s = SentenceBody(tense);
    const size_t first = s[0] == '"' ? 1 : 0;
    s[first] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[first])));
    return s;
  }

  RandomStream rng_;
};

}  // namespace

std::string GenerateEnglishText(uint64_t seed, size_t num_bytes) {
  std::string text;
  text.reserve(num_bytes + 2048);
  ProseWriter writer(seed);
  while (text.size() < num_bytes) {
    if (!text.empty()) text += "\n\n";
    writer.AppendParagraph(&text);
  }
  text.resize(num_bytes);
  return text;
}

}  // namespace pipetrain
