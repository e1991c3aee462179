// A JSON Schema (draft 2020-12) validator for the subset of keywords Diaspora's schemas
// use, and access to the schemas compiled into the library from schemas/.
//
// Supported keywords: type, enum, const, properties, patternProperties,
// additionalProperties, required, propertyNames, items, minItems, maxItems, uniqueItems,
// minimum, maximum, exclusiveMinimum, exclusiveMaximum, minLength, maxLength, pattern,
// allOf, anyOf, oneOf, not, if/then/else, local $ref ("#/$defs/..."), boolean schemas.
// Annotations (title, description, $id, $schema, default) are ignored. The non-standard
// keyword `errorMessage` (ignored by other validators) replaces the generic message of a
// failed value keyword (type of a scalar, pattern, enum, const, range, oneOf, anyOf) at
// the same level, so users read "must be a duration such as 30s" instead of a regex.
// Any other keyword is rejected when the schema is loaded, so a schema never silently
// means less to us than to python-jsonschema.
#pragma once

#include <boost/json/value.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "diaspora/error.hpp"

namespace diaspora::schema {

/// One step of a path into a JSON document: an object key or an array index.
using PathSegment = std::variant<std::string, std::size_t>;
using Path = std::vector<PathSegment>;

/// Renders a path as `sites[1].engine`; the empty path renders as `(root)`.
std::string format_path(const Path& path);

/// One validation failure.
struct Issue {
  Path path;             ///< the offending value (or the object lacking a key)
  std::string message;   ///< e.g. "unknown key 'wrokers'; did you mean 'workers'?"
  bool at_key = false;   ///< true when the object key itself is at fault (unknown key)
};

/// Thrown when a schema itself is malformed or uses an unsupported keyword.
class SchemaError : public Error {
 public:
  using Error::Error;
};

/// A loaded schema. Immutable after construction, so one instance may be shared by any
/// number of threads validating concurrently.
class Schema {
 public:
  /// Loads a schema document. Throws SchemaError naming the unsupported keyword, a bad
  /// $ref or a bad regular expression.
  explicit Schema(boost::json::value document, std::string name = "schema");
  ~Schema();
  Schema(Schema&&) noexcept;
  Schema& operator=(Schema&&) noexcept;

  /// Validates `instance` and returns every failure found (empty when valid). Errors are
  /// reported in document order; never throws for any instance.
  std::vector<Issue> validate(const boost::json::value& instance) const;

  /// The schema's name (its file name for built-in schemas).
  const std::string& name() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> self_;
};

/// A schema compiled into the library from schemas/<name>, e.g. "workflow.schema.json"
/// or "events/org.diaspora.task.failed.schema.json". Loaded on first use; thread-safe.
/// Returns nullptr when there is no such schema.
const Schema* builtin(std::string_view name);

/// Names of all built-in schemas, sorted.
std::vector<std::string> builtin_names();

/// Edit distance helper used for "did you mean" suggestions: the candidate closest to
/// `word` within distance 2 (or of which `word` is a prefix), or an empty string.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

/// Whether `text` contains a match of the ECMAScript regular expression `pattern`, as the
/// "pattern" keyword decides it (simple patterns take a fast matcher, the rest
/// std::regex). `fast` is set to whether the fast matcher was used. Throws
/// std::regex_error for a malformed pattern. For tests; thread-safe.
bool pattern_search(const std::string& pattern, std::string_view text, bool* fast = nullptr);

}  // namespace diaspora::schema
