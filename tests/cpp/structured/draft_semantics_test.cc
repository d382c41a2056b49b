// `$schema` selects the draft whose meaning applies (json_schema.cpp, SchemaLowerer::lower):
// each case's expectation is what python-jsonschema's validator_for(schema) decides.
#include <gtest/gtest.h>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

struct Case {
  const char* schema;
  const char* instance;
  bool valid;
};

TEST(DraftSemantics, SchemaSelectsTheDraft) {
  const Case cases[] = {
      // Through draft 7, $ref's siblings are ignored; from 2019-09 on they apply too.
      {R"({"$schema":"http://json-schema.org/draft-07/schema#","definitions":{"a":{"type":"integer"}},"$ref":"#/definitions/a","minimum":5})", "3", true},
      {R"({"$schema":"http://json-schema.org/draft-04/schema#","definitions":{"a":{"type":"integer"}},"$ref":"#/definitions/a","minimum":5})", "3", true},
      {R"({"$schema":"http://json-schema.org/draft-07/schema#","definitions":{"a":{"type":"integer"}},"$ref":"#/definitions/a","minimum":5})", "\"x\"", false},
      {R"({"definitions":{"a":{"type":"integer"}},"$ref":"#/definitions/a","minimum":5})", "3", false},
      {R"({"$schema":"https://json-schema.org/draft/2019-09/schema","$defs":{"a":{"type":"integer"}},"$ref":"#/$defs/a","minimum":5})", "3", false},
      // if/then/else exist from draft 7 on.
      {R"({"$schema":"http://json-schema.org/draft-06/schema#","if":{"type":"integer"},"then":{"minimum":5}})", "3", true},
      {R"({"$schema":"http://json-schema.org/draft-07/schema#","if":{"type":"integer"},"then":{"minimum":5}})", "3", false},
      {R"({"$schema":"http://json-schema.org/draft-07/schema#","if":{"type":"integer"},"then":{"minimum":5}})", "7", true},
      // `dependencies` is a keyword up to draft 7 only.
      {R"({"$schema":"https://json-schema.org/draft/2019-09/schema","dependencies":{"a":["b"]}})", R"({"a":1})", true},
      {R"({"$schema":"https://json-schema.org/draft/2020-12/schema","dependencies":{"a":["b"]}})", R"({"a":1})", true},
      {R"({"$schema":"http://json-schema.org/draft-07/schema#","dependencies":{"a":["b"]}})", R"({"a":1})", false},
      {R"({"$schema":"http://json-schema.org/draft-07/schema#","dependencies":{"a":["b"]}})", R"({"a":1,"b":2})", true},
      // Draft 4 integers have no fraction part.
      {R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"integer"})", "1.0", false},
      {R"({"$schema":"http://json-schema.org/draft-06/schema#","type":"integer"})", "1.0", true},
      {R"({"dependencies":{"a":["b"]}})", R"({"a":1})", true},  // no $schema: 2020-12
      // Draft 4: a numeric exclusiveMinimum is no keyword; boolean ones modify minimum.
      {R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"number","exclusiveMinimum":0})", "-1", true},
      {R"({"$schema":"http://json-schema.org/draft-04/schema#","minimum":0,"exclusiveMinimum":true})", "0", false},
      // Integers in every integral spelling (draft 6 on).
      {R"({"type":"integer"})", "1e+18", true},   {R"({"type":"integer"})", "0e5", true},
      {R"({"type":"integer"})", "1.25e2", true},  {R"({"type":"integer"})", "1.25e1", false},
      {R"({"type":"integer"})", "-1.0E+3", true}, {R"({"type":"integer"})", "1e-1", false},
      {R"({"type":"integer","minimum":0})", "1E+16", true}, {R"({"type":"integer","minimum":0})", "-1E+16", false},
      {R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"integer"})", "1e2", false},
  };
  GrammarCompiler c(byte_vocab());
  for (const Case& k : cases) {
    auto g = c.compile_uncached(std::string(R"({"json_schema":)") + k.schema + "}");
    EXPECT_EQ(matches(g, k.instance), k.valid) << k.schema << " on " << k.instance;
  }
}

}  // namespace
}  // namespace deepinfer::structured::test
