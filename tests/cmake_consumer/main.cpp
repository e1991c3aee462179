// Uses the installed headers and library: builds an event, encodes it, loads a spec.
#include <diaspora/core.hpp>

#include <iostream>

int main() {
  diaspora::events::TaskStarted started;
  started.task_id = "t-1";
  started.site = "edge";
  diaspora::Event e = diaspora::events::make_event("/consumer", started);
  std::string wire = diaspora::encode_event(e);
  auto back = diaspora::events::payload_of<diaspora::events::TaskStarted>(diaspora::decode_event(wire));
  auto spec = diaspora::parse_spec_string("version: 1\nname: c\nsites: [{name: a, engine: local}]\n");
  std::cout << "diaspora " << diaspora::version_string << " " << back.task_id << " " << spec.sites.size() << "\n";
  return back.task_id == "t-1" && spec.sites.size() == 1 ? 0 : 1;
}
