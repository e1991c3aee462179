// Generic JSON conversion of the described payload structs (Boost.Describe), and the
// explicit instantiations the public templates promise.
#include "diaspora/payloads.hpp"

#include <boost/describe/members.hpp>
#include <boost/describe/bases.hpp>
#include <boost/mp11/algorithm.hpp>

#include <algorithm>
#include <type_traits>

#include "internal.hpp"

namespace diaspora::events {

namespace json = boost::json;
namespace desc = boost::describe;

namespace {

template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_vector : std::false_type {};
template <class T> struct is_vector<std::vector<T>> : std::true_type {};

template <class T>
json::value to_value(const T& v);
template <class T>
void from_value(const json::value& j, T& out);

template <class T>
json::value to_value(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return json::value(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    return json::value(v);
  } else if constexpr (std::is_integral_v<T>) {
    return json::value(static_cast<std::int64_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    return json::value(static_cast<double>(v));
  } else if constexpr (std::is_same_v<T, Metrics>) {
    json::object o;
    for (const auto& [k, x] : v) o[k] = x;
    return o;
  } else if constexpr (is_vector<T>::value) {
    json::array a;
    for (const auto& x : v) a.push_back(to_value(x));
    return a;
  } else {
    json::object o;
    boost::mp11::mp_for_each<desc::describe_members<T, desc::mod_any_access | desc::mod_inherited>>([&](auto m) {
      const auto& field = v.*m.pointer;
      using F = std::remove_cvref_t<decltype(field)>;
      if constexpr (is_optional<F>::value) {
        if (field) o[m.name] = to_value(*field);
      } else {
        o[m.name] = to_value(field);
      }
    });
    return o;
  }
}

template <class T>
void from_value(const json::value& j, T& out) {
  if constexpr (std::is_same_v<T, std::string>) {
    out = std::string(j.as_string());
  } else if constexpr (std::is_same_v<T, bool>) {
    out = j.as_bool();
  } else if constexpr (std::is_integral_v<T>) {
    out = j.is_double() ? static_cast<T>(j.get_double()) : j.to_number<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    out = j.to_number<T>();
  } else if constexpr (std::is_same_v<T, Metrics>) {
    out.clear();
    for (const auto& kv : j.as_object()) out[std::string(kv.key())] = kv.value().to_number<double>();
  } else if constexpr (is_vector<T>::value) {
    out.clear();
    for (const auto& x : j.as_array()) from_value(x, out.emplace_back());
  } else {
    const json::object& o = j.as_object();
    boost::mp11::mp_for_each<desc::describe_members<T, desc::mod_any_access | desc::mod_inherited>>([&](auto m) {
      auto& field = out.*m.pointer;
      using F = std::remove_cvref_t<decltype(field)>;
      const json::value* jv = o.if_contains(m.name);
      if constexpr (is_optional<F>::value) {
        if (jv && !jv->is_null()) from_value(*jv, field.emplace());
        else field.reset();
      } else if (jv) {
        from_value(*jv, field);
      }
    });
  }
}

template <class P>
std::optional<std::string> subject_of(const P& p) {
  if constexpr (std::is_base_of_v<TaskRef, P>) return p.task_id;
  else if constexpr (std::is_same_v<P, ResourceStatus>) return p.resource_id;
  else if constexpr (std::is_same_v<P, DataArrived>) return p.stream;
  else if constexpr (std::is_same_v<P, DataItem>) return p.stream;
  else if constexpr (std::is_same_v<P, AnomalyPredicted>) return p.task_id ? p.task_id : std::optional(p.series);
  else if constexpr (std::is_same_v<P, ActionRequested> || std::is_same_v<P, ActionDone>) return p.task_id;
  else if constexpr (std::is_same_v<P, MetricSample>) return p.id;
  else if constexpr (std::is_same_v<P, PluginWarning>) return p.task_id;
  else return std::nullopt;
}

}  // namespace

const std::vector<std::string_view>& all_types() {
  static const std::vector<std::string_view> types = [] {
    std::vector<std::string_view> t = {
        TaskSubmitted::type, TaskStarted::type,   TaskHeartbeat::type,  TaskProgress::type, TaskCompleted::type,
        TaskFailed::type,    TaskCancelled::type, TaskRestarted::type,  TaskMigrated::type, ResourceStatus::type,
        DataArrived::type,   DataItem::type,      AnomalyPredicted::type, ActionRequested::type, ActionDone::type, MetricSample::type,
        PluginWarning::type, PluginStats::type};
    std::sort(t.begin(), t.end());
    return t;
  }();
  return types;
}

bool is_known_type(std::string_view type) noexcept {
  const auto& t = all_types();
  return std::binary_search(t.begin(), t.end(), type);
}

template <class Payload>
json::value to_json(const Payload& payload) {
  return to_value(payload);
}

template <class Payload>
Payload from_json(const json::value& data) {
  diaspora::detail::check_payload_data(Payload::type, data);
  Payload p{};
  from_value(data, p);
  return p;
}

template <class Payload>
Event make_event(std::string source, const Payload& payload) {
  Event e;
  e.id = make_uuid();
  e.source = std::move(source);
  e.type = std::string(Payload::type);
  e.subject = subject_of(payload);
  e.set_time(std::chrono::system_clock::now());
  e.datacontenttype = "application/json";
  e.data = to_json(payload);
  return e;
}

template <class Payload>
Payload payload_of(const Event& event) {
  if (event.type != Payload::type)
    throw EventError(EventErrc::unknown_type,
                     "type: expected '" + std::string(Payload::type) + "', got '" + event.type + "'");
  if (!event.data) throw EventError(EventErrc::invalid_data, "data: missing");
  return from_json<Payload>(*event.data);
}

#define DIASPORA_INSTANTIATE_PAYLOAD(P)                                   \
  template DIASPORA_PAYLOAD_API json::value to_json<P>(const P&);        \
  template DIASPORA_PAYLOAD_API P from_json<P>(const json::value&);      \
  template DIASPORA_PAYLOAD_API Event make_event<P>(std::string, const P&); \
  template DIASPORA_PAYLOAD_API P payload_of<P>(const Event&);

#define DIASPORA_PAYLOAD_API
DIASPORA_INSTANTIATE_PAYLOAD(TaskSubmitted)
DIASPORA_INSTANTIATE_PAYLOAD(TaskStarted)
DIASPORA_INSTANTIATE_PAYLOAD(TaskHeartbeat)
DIASPORA_INSTANTIATE_PAYLOAD(TaskProgress)
DIASPORA_INSTANTIATE_PAYLOAD(TaskCompleted)
DIASPORA_INSTANTIATE_PAYLOAD(TaskFailed)
DIASPORA_INSTANTIATE_PAYLOAD(TaskCancelled)
DIASPORA_INSTANTIATE_PAYLOAD(TaskRestarted)
DIASPORA_INSTANTIATE_PAYLOAD(TaskMigrated)
DIASPORA_INSTANTIATE_PAYLOAD(ResourceStatus)
DIASPORA_INSTANTIATE_PAYLOAD(DataArrived)
DIASPORA_INSTANTIATE_PAYLOAD(DataItem)
DIASPORA_INSTANTIATE_PAYLOAD(AnomalyPredicted)
DIASPORA_INSTANTIATE_PAYLOAD(ActionRequested)
DIASPORA_INSTANTIATE_PAYLOAD(ActionDone)
DIASPORA_INSTANTIATE_PAYLOAD(MetricSample)
DIASPORA_INSTANTIATE_PAYLOAD(PluginWarning)
DIASPORA_INSTANTIATE_PAYLOAD(PluginStats)

}  // namespace diaspora::events
