#include "worker/data/synthetic_text.h"

#include <cctype>
#include <map>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::map<std::string, int> CountWords(const std::string& text) {
  std::map<std::string, int> counts;
  std::string word;
  for (char c : text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      word.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    } else if (!word.empty()) {
      ++counts[word];
      word.clear();
    }
  }
  return counts;
}

TEST(SyntheticTextTest, GenerateEnglishText_SameSeed_SameText) {
  EXPECT_EQ(GenerateEnglishText(7, 5000), GenerateEnglishText(7, 5000));
  EXPECT_NE(GenerateEnglishText(7, 5000), GenerateEnglishText(8, 5000));
}

TEST(SyntheticTextTest, GenerateEnglishText_AnySize_ExactLengthAndPrefixOfLonger) {
  const std::string longer = GenerateEnglishText(3, 20000);
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{999}, size_t{20000}}) {
    const std::string text = GenerateEnglishText(3, n);
    EXPECT_EQ(text.size(), n);
    EXPECT_EQ(text, longer.substr(0, n));
  }
}

TEST(SyntheticTextTest, GenerateEnglishText_Bytes_PrintableAsciiOrNewline) {
  const std::string text = GenerateEnglishText(11, 200000);
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c <= 0x7e)) << "byte " << int{c} << " at " << i;
  }
}

TEST(SyntheticTextTest, GenerateEnglishText_Vocabulary_ManyDistinctCommonWords) {
  const std::map<std::string, int> counts = CountWords(GenerateEnglishText(5, 300000));
  EXPECT_GE(counts.size(), 300u);
  // Function words dominate, as in real English.
  const int the = counts.count("the") ? counts.at("the") : 0;
  for (const auto& [word, count] : counts) {
    if (word != "the") {
      EXPECT_LE(count, the) << word;
    }
  }
}

TEST(SyntheticTextTest, GenerateEnglishText_Structure_SentencesAndParagraphs) {
  const std::string text = GenerateEnglishText(2, 100000);
  size_t paragraphs = 0;
  for (size_t pos = text.find("\n\n"); pos != std::string::npos; pos = text.find("\n\n", pos + 2)) {
    ++paragraphs;
    // A paragraph ends a sentence and the next one starts with a capital.
    EXPECT_NE(std::string(".?").find(text[pos - 1]), std::string::npos)
        << text.substr(pos - 20, 40);
    const char next = text[pos + 2] == '"' ? text[pos + 3] : text[pos + 2];
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(next))) << text.substr(pos, 40);
  }
  EXPECT_GT(paragraphs, 100u);
  EXPECT_EQ(text.find("\n\n\n"), std::string::npos);
  EXPECT_EQ(text.find("  "), std::string::npos);
  // Every sentence after ". " starts with a capital letter or a quote.
  for (size_t pos = text.find(". "); pos != std::string::npos && pos + 2 < text.size();
       pos = text.find(". ", pos + 1)) {
    const char next = text[pos + 2];
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(next)) || next == '"')
        << text.substr(pos, 30);
  }
  EXPECT_NE(text.find(", "), std::string::npos);
}

TEST(SyntheticTextTest, GenerateEnglishText_Articles_AnBeforeVowels) {
  const std::string text = GenerateEnglishText(4, 300000);
  for (const char* wrong : {" a old ", " a apple ", " a empty ", " an big ", " an dog "}) {
    EXPECT_EQ(text.find(wrong), std::string::npos) << wrong;
  }
  EXPECT_NE(text.find(" an "), std::string::npos);
}

}  // namespace
}  // namespace pipetrain
