// A minimal HTTP/1.0 client for the /metrics endpoint.
#ifndef TEMB_TESTING_HTTP_GET_H_
#define TEMB_TESTING_HTTP_GET_H_

#include <string>

namespace temb::testing {

// GET `path` from 127.0.0.1:`port`; the whole reply, headers included
// (empty when the connection fails).
std::string HttpGet(int port, const std::string& path);

}  // namespace temb::testing

#endif  // TEMB_TESTING_HTTP_GET_H_
