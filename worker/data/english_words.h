// Word lists for GenerateEnglishText (internal to synthetic_text).
#ifndef PIPETRAIN_WORKER_DATA_ENGLISH_WORDS_H_
#define PIPETRAIN_WORKER_DATA_ENGLISH_WORDS_H_

#include <cstddef>

namespace pipetrain {
namespace english {

struct Noun {
  const char* one;   // singular
  const char* many;  // plural
};

struct Verb {
  const char* base;   // "see": plural present, after did/do/does
  const char* third;  // "sees": singular present
  const char* past;   // "saw"
};

template <typename T>
struct List {
  const T* items;
  size_t size;
};

List<Noun> Creatures();   // people and animals: subjects of actions
List<Noun> Things();      // objects that are acted on
List<Noun> PlaceNouns();  // objects of place prepositions
List<const char*> Adjectives();
List<Verb> TransitiveVerbs();
List<Verb> IntransitiveVerbs();
List<const char*> Adverbs();
List<const char*> PlacePrepositions();   // "under the table"
List<const char*> MotionPrepositions();  // "walked across the field"
List<const char*> TimePhrases();         // sentence openers, tense-neutral
List<const char*> Names();
List<const char*> SingularDeterminers();
List<const char*> PluralDeterminers();
List<const char*> Conjunctions();  // join two clauses after a comma

}  // namespace english
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_ENGLISH_WORDS_H_
